import pytest

from seqmem.errors import SimulatedOutOfMemoryError
from seqmem.sim.allocator import BFCAllocatorModel, ExactAllocator

MB = 1 << 20


def test_exact_allocator_counts_request_bytes():
    model = ExactAllocator()
    a = model.allocate(1000)
    model.allocate(24)
    model.free(a)
    assert model.in_use_bytes == 24


def test_bfc_splits_chunks_at_least_twice_the_request():
    model = BFCAllocatorModel()
    model.allocate(1 * MB)              # first region: 2 MiB, split in two halves
    assert model.in_use_bytes == 1 * MB
    assert model.region_bytes == 2 * MB


def test_bfc_hands_out_a_chunk_under_twice_the_request_whole():
    # As measured on TF 2.15's CPU BFC arena: a fresh 9 MiB tensor takes a 16 MiB region whole.
    model = BFCAllocatorModel()
    model.allocate(9 * MB)
    assert model.in_use_bytes == 16 * MB


def test_bfc_places_a_request_in_pieces_chunk_by_chunk_and_frees_them_together():
    # A TensorList of ten 1 MiB elements fills regions of 2, 4 and 8 MiB piece by piece, unpadded;
    # as one 10 MiB request it would take a 16 MiB region whole.
    model = BFCAllocatorModel()
    handle = model.allocate(10 * MB, pieces=10)
    assert model.in_use_bytes == 10 * MB
    model.free(handle)
    assert model.in_use_bytes == 0
    whole = BFCAllocatorModel()
    whole.allocate(10 * MB)
    assert whole.in_use_bytes == 16 * MB


def test_bfc_rounds_to_256_bytes_and_coalesces_on_free():
    model = BFCAllocatorModel()
    a = model.allocate(1)
    b = model.allocate(300)
    assert model.in_use_bytes == 256 + 512
    model.free(a)
    model.free(b)
    assert model.in_use_bytes == 0
    # everything merged back into one free chunk: a request of the whole region fits without growth
    model.allocate(2 * MB)
    assert model.region_bytes == 2 * MB


def test_bfc_starts_with_a_2_mib_region_and_a_large_first_request_opens_the_next():
    model = BFCAllocatorModel()
    assert model.region_bytes == 2 * MB and model.in_use_bytes == 0
    model.allocate(3 * MB)  # a 4 MiB region of its own, handed out whole (under twice the request)
    assert model.region_bytes == 6 * MB and model.in_use_bytes == 4 * MB


def test_bfc_limit_raises_out_of_memory():
    model = BFCAllocatorModel(limit_bytes=8 * MB)
    model.allocate(3 * MB)  # regions of 2 and 4 MiB: 2 MiB left
    with pytest.raises(SimulatedOutOfMemoryError, match="cannot allocate"):
        model.allocate(3 * MB)


def test_reserved_bfc_hands_out_a_chunk_under_twice_the_request_whole():
    # As measured on TF 2.15's CPU BFC arena: a 9 MiB tensor placed in a free 16 MiB chunk takes it whole.
    model = BFCAllocatorModel(reserved=True)
    hole = model.allocate(16 * MB)
    model.allocate(4 * MB)  # after it, so that the 16 MiB chunk, freed, stays a chunk of its own
    model.free(hole)
    model.allocate(9 * MB)
    assert model.in_use_bytes == 4 * MB + 16 * MB


def test_reserved_bfc_places_a_request_in_pieces_chunk_by_chunk_and_frees_them_together():
    # A TensorList of ten 1 MiB elements in an arena of 2 + 16 MiB: two fill the first region, eight are
    # split off the 16 MiB one, unpadded; as one 10 MiB request it would take the 16 MiB region whole.
    model = BFCAllocatorModel(limit_bytes=18 * MB, reserved=True)
    handle = model.allocate(10 * MB, pieces=10)
    assert model.in_use_bytes == 10 * MB
    model.free(handle)
    assert model.in_use_bytes == 0
    whole = BFCAllocatorModel(limit_bytes=18 * MB, reserved=True)
    whole.allocate(10 * MB)
    assert whole.in_use_bytes == 16 * MB


def test_reserved_bfc_arena_is_a_2_mib_region_and_the_rest_of_the_limit():
    model = BFCAllocatorModel(limit_bytes=8 * MB, reserved=True)
    model.allocate(6 * MB)  # the second region, 6 MiB, whole
    model.allocate(1 * MB)  # half the first
    assert model.in_use_bytes == 7 * MB
    with pytest.raises(SimulatedOutOfMemoryError, match="no free chunk"):
        model.allocate(2 * MB)  # 1 MiB left, in the first region


def test_reserved_bfc_without_a_limit_has_an_unbounded_second_region_and_a_small_arena_only_the_first():
    model = BFCAllocatorModel(reserved=True)
    model.allocate(600 * MB)
    assert model.in_use_bytes == 600 * MB
    small = BFCAllocatorModel(limit_bytes=2 * MB, reserved=True)
    small.allocate(1 * MB)
    with pytest.raises(SimulatedOutOfMemoryError, match="reserved"):
        small.allocate(2 * MB)
