"""ortfuse's own version: the one place it is written (pyproject.toml reads it from here).

``ortfuse.__version__`` is onnxruntime's, as for every other name ``import ortfuse as ort`` re-exports
(code that checks ``ort.__version__`` checks the ORT it runs on); ortfuse's is ``ortfuse.ortfuse_version``.
"""

__version__ = "0.1.0"
