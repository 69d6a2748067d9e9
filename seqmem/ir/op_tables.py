"""Small, sorted tables that classify TensorFlow op types by how they use memory.

These tables are the only place seqmem names op types for memory purposes, and
they import nothing of seqmem's. Keep them sorted (a test checks) so a missing
comma cannot join two names unnoticed.
"""

from __future__ import annotations

__all__ = [
    "ALL_GATHER_OPS",
    "ALL_REDUCE_OPS",
    "COLLECTIVE_OPS",
    "CONST_OPS",
    "DIVISION_OPS",
    "FOLDED_SHAPE_OPS",
    "FORWARDING_OPS",
    "FUNCTIONAL_LOOP_OPS",
    "FUNCTION_CALL_OPS",
    "GRADIENT_BARRIER_OPS",
    "INEXPENSIVE_KERNEL_OPS",
    "INLINE_OPS",
    "INPLACE_OPS",
    "LIST_PASSTHROUGH_OPS",
    "LIST_READ_OPS",
    "LIST_WRITE_OPS",
    "LOOP_BACK_OPS",
    "LOOP_BOUND_OPS",
    "LOOP_MERGE_OPS",
    "LOWERED_CONTROL_FLOW_OPS",
    "MATERIALIZED_CONSTANT_OPS",
    "NEUTRAL_ARITHMETIC_OPS",
    "NEVER_FOLDED_OPS",
    "PASSTHROUGH_IDENTITY_OPS",
    "PERSISTENT_OPS",
    "PRODUCT_OPS",
    "RECOMPUTABLE_OPS",
    "REMOVED_IDENTITY_OPS",
    "SHAPE_OPS",
    "SHARED_ELEMENT_OPS",
    "SPARSE_OP_PREFIXES",
    "SUM_OPS",
    "TF1_CONTROL_FLOW_OPS",
    "VARIABLE_UPDATE_OPS",
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
# AddN tries each input in turn, `kernels/aggregate_ops.h`): the cwise unary and
# binary kernels (`kernels/cwise_ops_common.h`), the activations and their
# gradients (`UnaryElementWiseOp`, `BinaryElementWiseOp` in `framework/numeric_op.h`),
# `Select`/`SelectV2` (into the chosen values), `BiasAdd`, `ClipByValue` and the softmaxes.
# Not `Cast`: it allocates its output whenever the type changes (`kernels/cast_op.cc`).
INPLACE_OPS = frozenset([
    "Abs",
    "Add",
    "AddN",
    "AddV2",
    "BiasAdd",
    "Ceil",
    "ClipByValue",
    "Cos",
    "Div",
    "DivNoNan",
    "Elu",
    "EluGrad",
    "Erf",
    "Exp",
    "Expm1",
    "Floor",
    "FloorDiv",
    "FloorMod",
    "LeakyRelu",
    "LeakyReluGrad",
    "Log",
    "Log1p",
    "LogSoftmax",
    "Maximum",
    "Minimum",
    "Mul",
    "MulNoNan",
    "Neg",
    "Pow",
    "RealDiv",
    "Reciprocal",
    "ReciprocalGrad",
    "Relu",
    "Relu6",
    "Relu6Grad",
    "ReluGrad",
    "Round",
    "Rsqrt",
    "RsqrtGrad",
    "Select",
    "SelectV2",
    "Selu",
    "SeluGrad",
    "Sigmoid",
    "SigmoidGrad",
    "Sign",
    "Sin",
    "Softmax",
    "Softplus",
    "SoftplusGrad",
    "Softsign",
    "SoftsignGrad",
    "Sqrt",
    "SqrtGrad",
    "Square",
    "SquaredDifference",
    "Sub",
    "Tanh",
    "TanhGrad",
    "Xdivy",
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

# Prefixes of the sparse ops that put a variable in copy-on-read mode (`EnsureSparseVariableAccess`): an
# embedding's gather, an optimizer's scatter into its slots (`edge.copy_on_read`).
SPARSE_OP_PREFIXES = ("ResourceGather", "ResourceScatter", "ResourceSparseApply")

# The variable updates that write in place unless the variable is in copy-on-read mode (`edge.in_place`).
VARIABLE_UPDATE_OPS = frozenset([
    "AssignAddVariableOp",
    "AssignSubVariableOp",
])

# Ops that exchange tensors with other workers (tensorflow/core/ops/collective_ops.cc, nccl_ops.cc).
COLLECTIVE_OPS = frozenset([
    "CollectiveAllToAllV2",
    "CollectiveAllToAllV3",
    "CollectiveBcastRecv",
    "CollectiveBcastRecvV2",
    "CollectiveBcastSend",
    "CollectiveBcastSendV2",
    "CollectiveGather",
    "CollectiveGatherV2",
    "CollectiveReduce",
    "CollectiveReduceScatterV2",
    "CollectiveReduceV2",
    "CollectiveReduceV3",
    "NcclAllReduce",
    "NcclBroadcast",
    "NcclReduce",
])
# All-reduces: output 0 has the shape and type of input 0 (attribute "T").
ALL_REDUCE_OPS = frozenset([
    "CollectiveReduce",
    "CollectiveReduceV2",
    "CollectiveReduceV3",
])
# All-gathers: output 0 is every worker's input 0 concatenated along axis 0; the group size in input 1 (V2)
# or in the attribute "group_size".
ALL_GATHER_OPS = frozenset([
    "CollectiveGather",
    "CollectiveGatherV2",
])

# A data-parallel step's join of every gradient before the updates (`ir.barriers`).
GRADIENT_BARRIER_OPS = frozenset([
    "IdentityN",
])

# Ops that return a TensorList they were given, with an element written or its length changed.
LIST_PASSTHROUGH_OPS = frozenset([
    "TensorListPushBack",
    "TensorListPushBackBatch",
    "TensorListResize",
    "TensorListScatterIntoExistingList",
    "TensorListSetItem",
])
# Ops that read one element of a TensorList, which a loop body then holds.
LIST_READ_OPS = frozenset([
    "TensorListGetItem",
    "TensorListPopBack",
])
# What a loop may push to a list without a buffer of its own: another list's element, a variable's value.
SHARED_ELEMENT_OPS = frozenset([
    "ReadVariableOp",
    "TensorListGetItem",
])

# Ops a function returns its argument through unchanged, as a loop invariant is (`edge.passthrough`).
PASSTHROUGH_IDENTITY_OPS = frozenset([
    "Identity",
    "Snapshot",
])
# Nodes of a loop body a pinned body leaves unchained: Grappler removes them (`edge.pinned_bodies`).
REMOVED_IDENTITY_OPS = frozenset([
    "Identity",
])
# Sums and products Grappler regroups where one is read by another of its kind alone (`ir.regrouped`).
SUM_OPS = frozenset([
    "Add",
    "AddN",
    "AddV2",
])
PRODUCT_OPS = frozenset([
    "Div",
    "Mul",
    "RealDiv",
])

# Constants as Grappler's constant folding sees them (`edge.folded_constants`): constant ops; ops that are
# constants of any size once their input's shape is known; shape ops it folds; divisions.
CONST_OPS = frozenset([
    "Const",
    "HostConst",
])
MATERIALIZED_CONSTANT_OPS = frozenset([
    "OnesLike",
    "ZerosLike",
])
FOLDED_SHAPE_OPS = frozenset([
    "Shape",
    "ShapeN",
    "Size",
])
DIVISION_OPS = frozenset([
    "Div",
    "RealDiv",
])
# Ops Grappler's arithmetic simplification removes by the neutral value of an input: x + 0, x * 1, x / 1.
NEUTRAL_ARITHMETIC_OPS = {
    0.0: frozenset(["Add", "AddV2"]),
    1.0: frozenset(["Div", "Mul", "RealDiv"]),
}
# Nodes constant folding never evaluates: calls, loops and conditionals, TF1 control flow, placeholders.
NEVER_FOLDED_OPS = FUNCTION_CALL_OPS | FUNCTIONAL_LOOP_OPS | TF1_CONTROL_FLOW_OPS | frozenset(
    ["If", "Placeholder", "StatelessIf"])

# Loops that carry a `parallel_iterations` bound: functional loops, and TF1 frames' Enter nodes.
LOOP_BOUND_OPS = FUNCTIONAL_LOOP_OPS | frozenset(["Enter", "RefEnter"])

# Control flow TensorFlow lowers into its functions' nodes before it runs a step (`rewrite.pin`).
LOWERED_CONTROL_FLOW_OPS = FUNCTIONAL_LOOP_OPS | FUNCTIONAL_COND_OPS


def writes_variable(op: str) -> bool:
    """Whether `op` changes a variable (ResourceApplyAdam, AssignAddVariableOp, ...)."""
    return op in VARIABLE_WRITE_OPS or op.startswith(_VARIABLE_WRITE_PREFIXES)


def is_persistent_op(op: str) -> bool:
    """Whether outputs of `op` are persistent memory (parameters, constants, inputs)."""
    return op in PERSISTENT_OPS
