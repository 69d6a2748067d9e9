"""Built-in training steps (mlp, cnn, resnet, lstm) and the simulator-accuracy table that measures them.

EXAMPLE_NAMES is here, free of TensorFlow, so the command line can offer them
without starting TensorFlow; `steps.EXAMPLES` builds them.
"""

EXAMPLE_NAMES = ("cnn", "lstm", "mlp", "resnet")
