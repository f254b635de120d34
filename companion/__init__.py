r"""Companion package of the book *Transformer Building Blocks*.

Every chapter of the book imports its code from here, and every function here is tested
against an independent oracle in ``tests/``. One module per chapter::

    book/NN_topic.ipynb   <->   companion/topic.py   <->   tests/test_topic.py

Import a chapter's module directly, e.g. ``from companion import positional`` or
``from companion.positional import sinusoidal_encoding``.

Shape legend (used in every docstring, and on the book's notation page):

==========  ===============================================================
``B``       batch size
``H``       number of attention heads
``L``       query (target) sequence length
``S``       key/value (source) sequence length; ``S == L`` in self-attention
``D``       feature width: the model width outside attention, the head
            dimension (``head_dim``) inside it
``...``     any number of leading dimensions
==========  ===============================================================

Tensors are batch-first, like :func:`torch.nn.functional.scaled_dot_product_attention`:
attention inputs are ``(B, H, L, D)`` unless a function says otherwise.

Conventions: functions hold the math and modules are thin wrappers around them; outputs keep
the input's dtype and device; factories take keyword-only ``dtype`` and ``device``; bad input
raises :class:`ValueError` or :class:`TypeError` naming the argument, what was expected and
what came.
"""

from companion.environment import default_device, environment_report, seed_everything

__version__ = "0.1.0"

__all__ = ["__version__", "default_device", "environment_report", "seed_everything"]
