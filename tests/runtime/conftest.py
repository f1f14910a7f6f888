"""Runtime tests. Under TRITON_INTERPRET=1 (CPU), works around Triton 3.6's interpreter turning
one-element arrays into loop bounds with ``int(array)``, which numpy >= 2.? rejects."""
import os

if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from triton.runtime import interpreter as _interpreter
    except ImportError:
        _interpreter = None
    if _interpreter is not None and hasattr(_interpreter, "_patch_lang_tensor"):
        _original = _interpreter._patch_lang_tensor

        def _patch_lang_tensor(tensor, scope):
            _original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

        _interpreter._patch_lang_tensor = _patch_lang_tensor
