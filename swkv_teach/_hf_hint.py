"""What to install for the Hugging Face door: below :mod:`swkv_teach.hf` and :mod:`swkv_teach.hf_cache`, which
both raise it when ``transformers`` is missing (hf.py imports hf_cache lazily, so hf_cache cannot import hf back)."""

INSTALL_HINT = 'Hugging Face transformers is needed for this; install it with: pip install -e ".[hf]"'
