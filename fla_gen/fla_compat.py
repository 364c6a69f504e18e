"""Generated ops where code expects flash-linear-attention (fla): a module that stands in for ``fla``.

Libraries that call fla by name look its functions up when they are imported. Hugging Face
transformers (5.x) does so in ``use_kernel_func_from_hub_with_fallback``: when a model module is
imported it imports ``fla`` and takes ``fla.<function name>`` (e.g. ``chunk_gated_delta_rule``),
else its own torch implementation. It then passes on only the keyword arguments the function's
signature declares, so a generated op must declare every keyword the model passes (the spec's flags
and options do): one it lacked would be dropped without an error.
"""

from __future__ import annotations

import types


def as_fla_module(*packages: types.ModuleType, name: str = "fla") -> types.ModuleType:
    """A module exposing the public ops of generated packages under their own names.

    Each package's ``__all__`` functions (``chunk_<op>``, ``fused_recurrent_<op>``, ``<op>_reference``)
    become attributes of the module, so a spec named after fla's op (``op gated_delta_rule``) provides
    fla's function names. Install it before the code that looks fla up is imported:
    ``sys.modules["fla"] = as_fla_module(generated.gated_delta_rule)``.

    Raises:
        ValueError: two packages export the same function name.
    """
    module = types.ModuleType(name, "generated fla-gen ops under flash-linear-attention's function names: "
                              + ", ".join(p.__name__ for p in packages))
    for pkg in packages:
        for attr in getattr(pkg, "__all__", ()):
            fn = getattr(pkg, attr)
            if not callable(fn):
                continue
            if hasattr(module, attr):
                raise ValueError(f"as_fla_module: {attr} is exported by two packages ({pkg.__name__} and an "
                                 f"earlier one)")
            setattr(module, attr, fn)
    return module
