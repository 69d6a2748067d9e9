"""Running steps: the measuring device, step analysis, `optimize`, `profile`, Keras integration."""
