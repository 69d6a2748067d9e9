import pytest

from seqmem.cli import main


@pytest.mark.parametrize("argv", [["demo", "--batch", "0"], ["demo", "--example", "nope"], ["frobnicate"],
                                  ["accuracy", "--budget-mb", "-3"], ["accuracy", "--case", "mlp:zero"]])
def test_bad_flags_exit_with_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "usage: seqmem" in capsys.readouterr().err

