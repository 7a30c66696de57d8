"""Layout planning (docs/ARCHITECTURE.md §9): after the rewrite, ortfuse lets ORT's own optimizer
block the convolutional regions (its NCHWc transformer), reads the graph ORT made, and runs what ORT
would have wrapped in reorders on the blocked tensors itself. The result is the model ORT loads."""
