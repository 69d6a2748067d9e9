import numpy as np
import tensorflow as tf

from seqmem.runtime.measure import captured_variables, variables_restored


def test_every_variable_a_step_captures_is_restored_also_slots_created_while_it_was_traced():
    # Keras' legacy SGD creates its momentum slots and step counter while the step is traced: the trace's
    # `graph.variables` does not list them, and a measurement that restored only those changed training
    model = tf.keras.Sequential([tf.keras.layers.Dense(4)])
    model.build([None, 3])
    optimizer = tf.keras.optimizers.legacy.SGD(learning_rate=0.1, momentum=0.9)
    lookup = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer([1], [2]), default_value=0)

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x)) * tf.cast(lookup.lookup(tf.constant(1)), tf.float32)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    x = tf.ones([2, 3])
    function = step.get_concrete_function(x)
    every = model.variables + optimizer.variables()
    captured = captured_variables(function)
    assert all(any(v.handle is handle for handle in captured) for v in every)
    assert len(captured) > len(function.graph.variables)
    assert lookup.resource_handle.dtype == tf.resource and all(h is not lookup.resource_handle for h in captured)
    step(x)
    before = [v.numpy().copy() for v in every]
    with variables_restored(captured_variables(function)):
        step(x)
        assert not all(np.array_equal(a, v.numpy()) for a, v in zip(before, every))
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, every))


def _address(variable: tf.Variable) -> int:
    return np.asarray(variable.read_value()).__array_interface__["data"][0]


def test_variables_are_restored_bit_for_bit_in_the_buffers_they_had():
    # assigned, a restored variable would adopt a buffer allocated at restore time, wherever the arena had room
    weights = tf.Variable(tf.random.stateless_normal([64, 32], seed=[1, 2]))
    steps = tf.Variable(tf.constant(7, tf.int64))
    signed_zero = tf.Variable(tf.constant([-0.0, 1.0]))
    flags = tf.Variable([True, False])
    slot = tf.Variable(tf.zeros([16, 8]))
    slot[:].assign(tf.fill([16, 8], 0.5))  # a sliced write: copy-on-read mode, as a sparse op leaves a variable
    every = [weights, steps, signed_zero, flags, slot]
    before = [v.numpy().tobytes() for v in every]
    with variables_restored(every):
        weights.assign_add(tf.fill([64, 32], np.inf))  # assigned: v - v would not be 0
        steps.assign_add(5)
        signed_zero.assign([3.0, 4.0])
        flags.assign([False, True])
        slot[:].assign(tf.ones([16, 8]))
    assert [v.numpy().tobytes() for v in every] == before
    addresses = _address(weights), _address(steps)
    with variables_restored(every):
        weights.assign_sub(tf.ones([64, 32]))
        steps.assign_add(1)
    assert (_address(weights), _address(steps)) == addresses
    assert [v.numpy().tobytes() for v in every] == before
