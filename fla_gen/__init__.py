"""fla-gen: compile linear-attention recurrences declared in a small DSL into Triton kernels.

The pipeline, one module per stage (each a pure function of the previous stage's value):
``parse`` → ``check`` → ``canonical`` → ``plan`` → ``emit`` (and ``reference`` for the oracle).
``runtime`` holds the small support library that generated packages import.
"""

__version__ = "0.1.0"
