"""A simulated accelerator for CPU tests: tensors that say they live on another device and follow CUDA's device rules.

A CPU-only CI cannot see the commonest GPU crash, a tensor on the CPU meeting one on the GPU (an index on the wrong
device, `torch.cat` of both, a CPU generator driving a GPU draw). Under `simulated_accelerator()` every tensor created
on, or moved to, the device the code under test was given is a `SimTensor`: a wrapper whose `.device` is `meta`
(whose device guard is a no-op, unlike an absent CUDA's) and whose values are real, computed on the CPU. Every
operation is checked as CUDA checks it and raises `DeviceMismatch` where CUDA would raise; otherwise it computes
exactly what the CPU computes, so a simulated run also reproduces a CPU run's numbers.

Rules, as CUDA has them (torch 2.x):
- an operation may mix device tensors with host tensors of zero dimensions only (CPU scalars are allowed on CUDA);
- indexing a device tensor with host indices is allowed (CUDA copies them over); a host tensor indexed with device
  indices, or any other mix, is not;
- a random draw on the device needs a device generator, and a host draw a host generator;
- copies (`.to`, `.cpu()`, `copy_`) are the explicit way across.
The meta device stands in for `cuda`: the code under test must take its device from a tensor or from
`resolve_device`, never spell `"cuda"` (which the simulation cannot reach).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

SIM = torch.device("meta")

# host indices may index a device tensor: CUDA moves them over (the tensor indexed is the first argument)
_HOST_INDEX_OK = {"index.Tensor", "index_put.default", "index_put_.default", "_index_put_impl_.default"}
# explicit crossings between host and device
_COPIES = {"_to_copy.default", "copy_.default", "_copy_from.default", "_copy_from_and_resize.default",
           "lift_fresh.default", "set_.source_Tensor"}


class DeviceMismatch(RuntimeError):
    """An operation CUDA would refuse: host and device tensors (or a generator of the other device) mixed."""


class SimTensor(torch.Tensor):
    """A CPU tensor `elem` presented as living on the simulated device."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(),
                                                  storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                                  layout=elem.layout, device=SIM, requires_grad=elem.requires_grad)
        out.elem = elem
        return out

    def __repr__(self) -> str:
        return f"SimTensor({self.elem!r})"

    def __reduce_ex__(self, protocol):
        # saved as the CPU tensor it holds (a checkpoint of a real device's tensors loads as plain tensors too, and
        # `load_state_dict` moves them to the parameters' device)
        return self.elem.__reduce_ex__(protocol)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _simulate(func, args, kwargs)


_REAL_GENERATOR = torch.Generator
_SIM_GENERATORS: list[torch.Generator] = []


def _is_device_generator(gen: torch.Generator) -> bool:
    """Whether `gen` (as an operation receives it: a new Python wrapper of the same generator) is one of the
    simulated device's. Told by its state, since the wrappers differ: a host generator in the very same state
    (seeded alike, drawn alike) would be taken for it, which the code under test avoids by seeding apart."""
    state = gen.get_state()
    return any(torch.equal(state, g.get_state()) for g in _SIM_GENERATORS)


class _GeneratorMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _REAL_GENERATOR)


class _Generator(metaclass=_GeneratorMeta):
    """`torch.Generator` within the simulation: `device=` the simulated device gives a host generator that counts
    as a device one (a device draw must use it, a host draw must not)."""

    def __new__(cls, device=None):
        if device is not None and torch.device(device).type == SIM.type:
            gen = _REAL_GENERATOR()
            _SIM_GENERATORS.append(gen)
            return gen
        return _REAL_GENERATOR() if device is None else _REAL_GENERATOR(device)


def _is_device(x) -> bool:
    return isinstance(x, SimTensor)


def _simulate(func, args, kwargs):
    kwargs = dict(kwargs or {})
    name = str(func.overloadpacket.__name__) + "." + func._overloadname
    flat, _ = tree_flatten((args, kwargs))
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    on_device = [x for x in tensors if _is_device(x)]
    on_host = [x for x in tensors if not _is_device(x) and x.dim() > 0]
    target = kwargs.get("device")
    to_device = target is not None and torch.device(target).type == SIM.type
    if on_device and on_host and name not in _COPIES:
        host_index_ok = name in _HOST_INDEX_OK and args and _is_device(args[0])
        if not host_index_ok:
            shapes = ", ".join(f"{'device' if _is_device(t) else 'cpu'}{list(t.shape)}" for t in tensors)
            raise DeviceMismatch(f"{name} mixes tensors on the device and on the CPU ({shapes}): CUDA refuses this")
    gen = kwargs.get("generator")
    if gen is not None:
        device_draw = bool(on_device) or to_device
        device_gen = _is_device_generator(gen)
        if device_gen != device_draw:
            raise DeviceMismatch(f"{name}: a {'device' if device_draw else 'CPU'} draw with a "
                                 f"{'device' if device_gen else 'CPU'} generator: CUDA refuses this")
    if to_device:
        kwargs["device"] = torch.device("cpu")

    def unwrap(x):
        return x.elem if isinstance(x, SimTensor) else x

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if name in _COPIES and target is not None:
        wrap = to_device
    elif name in ("copy_.default",):
        wrap = _is_device(args[0])
    else:
        wrap = bool(on_device) or to_device
    if name == "_local_scalar_dense.default":
        wrap = False
    return tree_map(lambda x: SimTensor(x) if wrap and isinstance(x, torch.Tensor) else x, out)


class _Constructors(TorchFunctionMode):
    """`torch.tensor(data, device=...)` and friends build their tensor outside the dispatcher: built on the host here,
    then moved through it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        target = kwargs.get("device")
        if func in _CONSTRUCTORS and target is not None and torch.device(target).type == SIM.type:
            kwargs["device"] = "cpu"
            return func(*args, **kwargs).to(SIM)
        if args and isinstance(args[0], SimTensor):
            if func is torch.Tensor.tolist:  # CUDA copies to the host; the wrapper has no storage of its own
                return args[0].elem.tolist()
            if func in (torch.Tensor.numpy, torch.Tensor.__array__):
                raise DeviceMismatch("numpy() of a device tensor: CUDA refuses this (call .cpu() first)")
        return func(*args, **kwargs)


_CONSTRUCTORS = {torch.tensor, torch.as_tensor, torch.asarray, torch.from_numpy}


class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _simulate(func, args, kwargs)


@contextlib.contextmanager
def simulated_accelerator() -> Iterator[torch.device]:
    """Within: the simulated device's tensors and generators follow CUDA's rules; yields the device to use."""
    import torch._dynamo  # noqa: F401  (imported before the patch: its annotations use torch.Generator)

    torch.Generator = _Generator  # type: ignore[misc]
    # `module.to(device)` swaps each parameter's contents in place, as a real device's does, so tied weights (an
    # embedding shared with the output layer) stay one parameter
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        with _Constructors(), _Mode():
            yield SIM
    finally:
        torch.Generator = _REAL_GENERATOR  # type: ignore[misc]
        torch.__future__.set_swap_module_params_on_conversion(swap)
        _SIM_GENERATORS.clear()
