import ast
import pathlib

import seqmem.ir.op_tables as op_tables


def test_op_tables_are_sorted_and_free_of_joined_names():
    tree = ast.parse(pathlib.Path(op_tables.__file__).read_text())
    tables = 0
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call):
            names = [element.value for element in statement.value.args[0].elts]
            assert names == sorted(names), f"{statement.targets[0].id} is not sorted"
            assert all(name.isidentifier() for name in names), names
            tables += 1
    assert tables >= 5
