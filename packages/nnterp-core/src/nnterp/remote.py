"""How a StandardizedTransformer's trace runs on an NDIF server that hosts the plain checkpoint.

nnsight ships a remote trace as its block's source and the envoys it touches;
the server runs the block against its own model. Three things make that work
for nnterp:

- The request names the plain deployment: the model key's class is nnsight's
  ``TransformersModel``, whatever wrapper the user built, so a server that
  hosts the checkpoint for everyone runs it. A model loaded from a local
  directory is keyed by that directory, for a server that has the same one.
- The standard envoys travel by reference: the server rebuilds them from the
  ``nnterp`` packages it has installed (``nnterp-core`` and the plugin of the
  model's family, at the client's versions). nnsight would ship packages
  installed in editable mode by value, source and all; nnterp's descriptors
  and routing state are not built to be rebuilt that way, so they are taken
  out of that list before a request is serialized. A server without them
  fails to deserialize the request with ``No module named 'nnterp'``.
- Routing is a binding of the process that runs the model: a value that needs
  routed kernels (a recurrent mixer's ``states``) raises ``Unavailable`` on a
  server that has not routed them, with the reason, like any unserved value.
"""

from __future__ import annotations


def ship_by_reference() -> None:
    """Keep nnterp and its plugins out of the modules nnsight serializes by value; the server imports them."""
    from cloudpickle.cloudpickle import _PICKLE_BY_VALUE_MODULES
    from nnsight.ndif import pull_env

    from .registry import REGISTRY

    pull_env()  # registers every editable install by value, once per process; undone for ours below
    # A plugin is a module, or an object registered directly (whose class's module is its package's).
    plugins = (getattr(info.module, "__name__", type(info.module).__module__) for info in REGISTRY.plugins())
    _PICKLE_BY_VALUE_MODULES.difference_update({"nnterp"} | {name.partition(".")[0] for name in plugins})
