"""seqmem.sim.iteration: a loop's iterations replayed through an allocator model, elements placed as written."""

from seqmem.sim.allocator import BFCAllocatorModel, ExactAllocator
from seqmem.sim.iteration import Iteration, replay

KIB = 1 << 10

# step 0 allocates A (100) until step 1; step 1 allocates B (50) until the iteration's end; step 2 allocates a
# temporary C (30); the iteration writes its element of loop output 3 at step 1
_ITERATION = Iteration(steps=3, buffers=((100, 0, 1), (50, 1, -1), (30, 2, 2)), elements=((3, 1),))


def test_its_peak_is_the_most_its_buffers_hold_at_once():
    assert _ITERATION.peak_bytes == 150  # A and B at step 1


def test_each_iteration_places_its_element_as_it_writes_it_and_frees_its_own_buffers():
    model = ExactAllocator()
    replayed = replay(model, _ITERATION, {3: (40, 4)}, held=(7,), tensor_bytes=0)
    # four iterations; the last one's step 1 holds the held 7, A and B, and the four elements
    assert replayed.peak_in_use_bytes == replayed.peak_tensor_bytes == 7 + 150 + 40
    assert model.in_use_bytes == 40  # the elements stay, grouped under one handle
    model.free(replayed.list_handles[3])
    assert model.in_use_bytes == 0


def test_an_element_the_iteration_does_not_write_is_placed_at_its_end():
    model = ExactAllocator()
    replayed = replay(model, _ITERATION, {3: (40, 4), 5: (8, 2)}, held=(), tensor_bytes=0)
    assert replayed.peak_in_use_bytes == 150 + 40 + 8  # and output 5's two, placed as the first two iterations end
    assert model.in_use_bytes == 48


def test_a_loop_that_fills_no_list_runs_one_iteration():
    model = BFCAllocatorModel()
    before = model.in_use_bytes
    replayed = replay(model, _ITERATION, {}, held=(), tensor_bytes=10)
    assert replayed.list_handles == {}
    assert replayed.peak_tensor_bytes == 10 + 150
    assert model.in_use_bytes == before  # every buffer freed


def test_the_order_decides_the_chunks():
    # each iteration: a 512 KiB temporary, then a 64 KiB buffer kept to its end (next to the temporary), and
    # a 300 KiB element. Written after the temporary is freed, the element takes the temporary's chunk
    # unsplit (less than twice the element); written while it is live, the element gets a chunk elsewhere
    def chunks(element_step):
        iteration = Iteration(steps=2, buffers=((512 * KIB, 0, 0), (64 * KIB, 0, -1)), elements=((0, element_step),))
        model = BFCAllocatorModel()
        replay(model, iteration, {0: (4 * 300 * KIB, 4)}, held=(), tensor_bytes=0)
        return model.in_use_bytes  # the four elements' chunks

    assert chunks(element_step=1) == 4 * 512 * KIB
    assert chunks(element_step=0) < 4 * 512 * KIB
