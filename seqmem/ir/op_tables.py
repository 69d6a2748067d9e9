"""Small, sorted tables that classify TensorFlow op types by how they use memory.

These tables are the only place seqmem names op types for memory purposes, and
they import nothing of seqmem's. Keep them sorted (a test checks) so a missing
comma cannot join two names unnoticed.
"""

from __future__ import annotations

__all__ = [
    "FORWARDING_OPS",
    "FUNCTIONAL_LOOP_OPS",
    "FUNCTION_CALL_OPS",
    "INEXPENSIVE_KERNEL_OPS",
    "INLINE_OPS",
    "INPLACE_OPS",
    "LIST_WRITE_OPS",
    "LOOP_BACK_OPS",
    "LOOP_MERGE_OPS",
    "PERSISTENT_OPS",
    "RECOMPUTABLE_OPS",
    "SHAPE_OPS",
    "TF1_CONTROL_FLOW_OPS",
    "VARIABLE_WRITE_OPS",
    "VIEW_OPS",
    "is_persistent_op",
    "writes_variable",
]

# A TF1 while loop closes through NextIteration -> Merge; those back edges are
# left out of topological orders, as TensorFlow's executor does.
LOOP_BACK_OPS = frozenset(["NextIteration", "RefNextIteration"])
LOOP_MERGE_OPS = frozenset(["Merge", "RefMerge"])

# A tf.function's while loop: one node, its body and condition functions in the library.
FUNCTIONAL_LOOP_OPS = frozenset(["StatelessWhile", "While"])

# A call of a library function (its `f` attribute), e.g. the functions Keras' LSTM and GRU run their loops in.
FUNCTION_CALL_OPS = frozenset(["PartitionedCall", "StatefulPartitionedCall"])

# A tf.function's conditional: one node, its branches in the library.
FUNCTIONAL_COND_OPS = frozenset(["Case", "If", "StatelessCase", "StatelessIf"])

# Nodes TensorFlow replaces by their functions' nodes before it runs a step (inlined calls, lowered loops and
# conditionals): each of their outputs can be ready before the node's function has run to its end.
FUNCTIONAL_OPS = FUNCTION_CALL_OPS | FUNCTIONAL_LOOP_OPS | FUNCTIONAL_COND_OPS

# Ops whose kernels tell TensorFlow's executor they are inexpensive
# (OpKernel::IsExpensive() is false), so the executor runs them inline
# whatever they cost: control flow, no-ops and resource-handle reads.
INEXPENSIVE_KERNEL_OPS = frozenset([
    "Enter",
    "Exit",
    "LoopCond",
    "Merge",
    "NextIteration",
    "NoOp",
    "ReadVariableOp",
    "Switch",
    "VarHandleOp",
])

# Ops whose outputs live for the whole step outside the step's own allocations:
# parameters, constants and resource handles, and the step's inputs.
PERSISTENT_OPS = frozenset([
    "Const",
    "HostConst",
    "Placeholder",
    "PlaceholderWithDefault",
    "VarHandleOp",
    "Variable",
    "VariableV2",
    "_Arg",
])

# A step's arguments: those holding no resource handle are its inputs (the others
# are variables).
STEP_ARGUMENT_OPS = frozenset([
    "Placeholder",
    "PlaceholderWithDefault",
    "_Arg",
])

# Ops that read only a tensor's metadata, never its contents.
SHAPE_OPS = frozenset([
    "Rank",
    "Shape",
    "ShapeN",
    "Size",
])

# Ops whose output i shares the buffer of input i (input 0 for single-output
# ops): TensorFlow forwards the buffer instead of copying it. ReadVariableOp
# returns the variable's own buffer unless a write is pending.
VIEW_OPS = frozenset([
    "ExpandDims",
    "Identity",
    "IdentityN",
    "ReadVariableOp",
    "Reshape",
    "Squeeze",
    "StopGradient",
])

# Ops TensorFlow's executor runs inline, the moment they are ready, whatever
# its cost estimate says: their kernels say they are inexpensive, or they
# allocate nothing on the step's behalf. A pinned order leaves them free.
INLINE_OPS = INEXPENSIVE_KERNEL_OPS | PERSISTENT_OPS | SHAPE_OPS | VIEW_OPS

# TF1 control flow (tf.function's functional While and If are single nodes
# instead): nodes inside a loop frame or a conditional branch cannot take control
# edges from outside it, so such graphs are not pinned.
TF1_CONTROL_FLOW_OPS = frozenset([
    "Enter",
    "Exit",
    "LoopCond",
    "Merge",
    "NextIteration",
    "RefEnter",
    "RefExit",
    "RefMerge",
    "RefNextIteration",
    "RefSwitch",
    "Switch",
])

# Element-wise ops whose kernels write into an input buffer of the same size
# when that input has no other reader left (forward_input_or_allocate_output;
# AddN tries each input in turn, `kernels/aggregate_ops.h`).
INPLACE_OPS = frozenset([
    "Add",
    "AddN",
    "AddV2",
    "BiasAdd",
    "Cast",
    "Elu",
    "EluGrad",
    "Mul",
    "Neg",
    "RealDiv",
    "Relu",
    "Relu6",
    "ReluGrad",
    "Rsqrt",
    "Sigmoid",
    "SigmoidGrad",
    "Sqrt",
    "Square",
    "Sub",
    "Tanh",
    "TanhGrad",
])

# Other kernels that write one output into one input's buffer when that input has the output's size and no
# other reader left (forward_input_or_allocate_output), by op: (input, output). The cross-entropy kernels
# write the logits' gradient over the logits.
FORWARDING_OPS = {
    "SoftmaxCrossEntropyWithLogits": (0, 1),
    "SparseSoftmaxCrossEntropyWithLogits": (0, 1),
}

# Ops that write an element into a TensorList (a loop's accumulator, a TensorArray), by op: the input holding
# the element.
LIST_WRITE_OPS = {
    "TensorListPushBack": 1,
    "TensorListSetItem": 2,
}

# Cheap, deterministic, stateless forward ops whose outputs the selector may free and recompute in
# backward from their inputs (element-wise ops and activations, and batch normalization, whose training
# form recomputes the same batch statistics from the same input).
RECOMPUTABLE_OPS = frozenset([
    "Add",
    "AddV2",
    "BiasAdd",
    "Cast",
    "Elu",
    "FusedBatchNormV3",
    "LeakyRelu",
    "Maximum",
    "Minimum",
    "Mul",
    "Neg",
    "RealDiv",
    "Relu",
    "Relu6",
    "Rsqrt",
    "Selu",
    "Sigmoid",
    "Softplus",
    "Sqrt",
    "Square",
    "Sub",
    "Tanh",
])


# Ops that change a variable in place: these, and every op whose type starts with one of
# `_VARIABLE_WRITE_PREFIXES` (optimizers' update kernels, for resource and TF1 reference variables).
VARIABLE_WRITE_OPS = frozenset([
    "Assign",
    "AssignAdd",
    "AssignAddVariableOp",
    "AssignSub",
    "AssignSubVariableOp",
    "AssignVariableOp",
    "ResourceStridedSliceAssign",
])
_VARIABLE_WRITE_PREFIXES = ("Apply", "ResourceApply", "ResourceScatter", "ResourceSparseApply", "SparseApply")


def writes_variable(op: str) -> bool:
    """Whether `op` changes a variable (ResourceApplyAdam, AssignAddVariableOp, ...)."""
    return op in VARIABLE_WRITE_OPS or op.startswith(_VARIABLE_WRITE_PREFIXES)


def is_persistent_op(op: str) -> bool:
    """Whether outputs of `op` are persistent memory (parameters, constants, inputs)."""
    return op in PERSISTENT_OPS
