"""seqmem.sim.calls: a call is charged the most any stretch of its body holds, less the inputs freed before it."""

from seqmem.sim.calls import CallCharge

MB = 1 << 20


def test_a_stretch_after_an_input_is_freed_counts_less_that_input():
    charge = CallCharge(peaks=((3 * MB, ()), (8 * MB, (0,)), (5 * MB, (0, 2))), returned_bytes=MB)
    sizes = {0: 4 * MB, 1: 7 * MB, 2: 6 * MB}
    assert charge.bytes(sizes.__getitem__) == 8 * MB - 4 * MB - MB  # the second stretch: 4 MB over 3
    assert charge.bytes({0: 0, 1: 0, 2: 0}.__getitem__) == 8 * MB - MB  # inputs of no size free nothing


def test_a_call_whose_body_holds_less_than_it_returns_is_charged_nothing():
    assert CallCharge(peaks=((MB, ()),), returned_bytes=2 * MB).bytes(lambda index: 0) == 0
    assert CallCharge(peaks=(), returned_bytes=0).bytes(lambda index: 0) == 0
