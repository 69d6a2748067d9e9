"""Training steps the project did not write, and how seqmem does on them (`python -m models.zoo`)."""
