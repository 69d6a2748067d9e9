import gc

import pytest

from seqmem.gc_pause import gc_paused, without_gc


def test_gc_paused_restores_the_collector_state_even_on_error():
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the inner block does not re-enable what the outer paused
            raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        without_gc(lambda: None)()
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
