"""One chain of a reference sampler on a zoo model, run in chunks with a checkpoint after each:
the runner under :func:`zoo.reference`.

The sampler (:mod:`zoo.mcmc.samplers`, e.g. :class:`~zoo.mcmc.samplers.NUTS`) builds a Pyro MCMC
kernel, driven as ``pyro.infer.MCMC`` drives it (``setup``, then ``sample`` once per transition,
then the kernel's ``transforms`` to the constrained space), one chunk of transitions at a time
so that a long run can stop and resume. Warm-up (the sampler's adaptation) is one chunk; after
it, each chunk of draws ends with a checkpoint holding the chain's unconstrained position, what
the warm-up adapted, the draws so far with the sampler's per-draw statistics (ArviZ's
``sample_stats``) and torch's generator state. A resumed chain rebuilds the kernel from those,
with adaptation off, and restores the generator, so it continues with exactly the draws the
uninterrupted chain makes.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import pyro
import torch
from pyro.poutine.util import site_is_subsample

from zoo.data.fingerprint import data_fingerprint
from zoo.mcmc.samplers import NUTS, SAMPLERS, Sampler
from zoo.runtime.rng import forked, seeded
from zoo.storage import checks as file_checks
from zoo.storage import files


@dataclass(frozen=True)
class ChainSettings:
    """What one chain does: ``warmup`` adaptation transitions, then ``draws`` kept ones in
    chunks of ``chunk``, from ``seed``, with ``sampler``."""

    warmup: int
    draws: int
    chunk: int
    seed: int
    sampler: Sampler = NUTS()

    def as_dict(self) -> dict:
        """Plain data, as files and ``Reference.options`` record it: the counts, the seed and
        the sampler's settings (its name under ``"sampler"``)."""
        counts = {k: v for k, v in asdict(self).items() if k != "sampler"}
        return {**counts, **self.sampler.settings()}


def chain_path(folder: Path, chain: int) -> Path:
    """Where chain ``chain``'s checkpoint lives in ``folder``."""
    return Path(folder) / f"chain{chain}.pt"


def run_chain(model, x, y, settings: ChainSettings, chain: int, folder: Path, counter=None):
    """Run (or resume) chain ``chain`` to ``settings.draws`` draws, checkpointing into
    ``folder``; ``counter[chain]`` (a shared array, optional) counts finished transitions."""
    path = chain_path(folder, chain)
    state = read_chain(path) if path.exists() else None
    if state is not None:
        check_resumable(state, settings, chain, x, y, model)
        if len(state["stats"]["lp"]) >= settings.draws:
            return
    seed = settings.seed * 1_000_003 + chain
    with warnings.catch_warnings(), seeded(seed, x.device):
        # Pyro's jit_compile calls torch.jit.trace, whose deprecation notice would show once per
        # chain: that one notice is kept from the user (zoo.inference.compiled.TRACED_ON says
        # where tracing was run), and the tracer's notes on Python values.
        warnings.filterwarnings("ignore", r"`?torch\.jit\.trace`? is deprecated", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        if state is None:
            kernel = settings.sampler.kernel(model)
            kernel.setup(settings.warmup, x, y)
            z = {k: v.detach() for k, v in kernel.initial_params.items()}
            for _ in range(settings.warmup):
                z = kernel.sample(z)
                _count(counter, chain)
            state = _state(kernel, z, settings, chain, x, y)
            _save(path, state)
        else:
            _count(counter, chain, settings.warmup + len(state["stats"]["lp"]))
            kernel = _resumed_kernel(model, settings.sampler, state, x, y)
            z = dict(state["z"])
            files.set_torch_rng_state(state["rng"])
        while len(state["stats"]["lp"]) < settings.draws:
            todo = min(settings.chunk, settings.draws - len(state["stats"]["lp"]))
            z = _draw_chunk(kernel, settings.sampler, z, todo, state, counter, chain)
            state["z"] = z
            state["rng"] = files.torch_rng_state()
            _save(path, state)


def _resumed_kernel(model, sampler: Sampler, state: dict, x, y):
    """A kernel at what the warm-up adapted, adaptation off, at ``state["z"]``."""
    kernel = sampler.kernel(model, adapted=state)
    kernel.initial_params = dict(state["z"])
    kernel.setup(0, x, y)
    sampler.restore(kernel, state)
    return kernel


def _draw_chunk(kernel, sampler: Sampler, z, todo: int, state: dict, counter, chain: int):
    """``todo`` transitions; each draw (constrained) and its statistics appended to ``state``."""
    stats, draws = state["stats"], state["draws"]
    for _ in range(todo):
        z, values = sampler.transition(kernel, z)
        for name in sampler.stat_names:
            stats[name].append(values[name])
        for name, value in z.items():
            transform = kernel.transforms.get(name)
            value = transform.inv(value) if transform is not None else value
            draws.setdefault(name, []).append(value.detach().clone())
        _count(counter, chain)
    return z


def _state(kernel, z: dict, settings: ChainSettings, chain: int, x, y) -> dict:
    """A chain's checkpoint right after warm-up: no draws yet."""
    return {
        "format": files.FORMAT,
        "kind": "hmc-chain",
        "version": files.VERSION,
        "chain": chain,
        "settings": settings.as_dict(),
        "data": data_fingerprint((x, y)),
        "z": z,
        **settings.sampler.adapted(kernel),
        "draws": {},
        "stats": {name: [] for name in settings.sampler.stat_names},
        "rng": files.torch_rng_state(),
    }


def _legacy_fingerprint(x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """What chain checkpoints of format 2 recorded of the data: the size and the sums."""
    return [float(x.shape[0]), float(x.double().sum()), float(y.double().sum())]


def check_resumable(state: dict, settings: ChainSettings, chain: int, x, y, model=None) -> None:
    """Refuse a checkpoint of another run: other data (their SHA-256 fingerprint,
    :mod:`zoo.data.fingerprint`), seed, warm-up or kernel settings; and, given the ``model``, a
    position, draws or mass matrix of other sites or shapes (:func:`check_against_model`)."""
    if model is not None and hasattr(model, "site_shapes"):
        check_against_model(state, f"the checkpoint of chain {chain}", model.site_shapes)
    saved = {"sampler": NUTS.name, **state["settings"]}  # files before samplers were named
    now = settings.as_dict()
    differ = [k for k in now if k not in ("draws", "chunk") and saved.get(k) != now[k]]
    if differ:
        raise ValueError(
            f"the checkpoint of chain {chain} was run with other settings "
            f"({', '.join(f'{k}={saved.get(k)!r} now {now[k]!r}' for k in differ)}): pass the "
            "same ones to resume it, or another checkpoint folder to start afresh"
        )
    saved_data = state["data"]
    now_data = (
        _legacy_fingerprint(x, y) if isinstance(saved_data, list) else data_fingerprint((x, y))
    )
    if saved_data != now_data:
        raise ValueError(
            f"the checkpoint of chain {chain} was run on other data (size or values differ): "
            "pass the same data to resume it, or another checkpoint folder to start afresh"
        )


def read_chain(path: Path) -> dict:
    """A chain checkpoint (plain data, read without unpickling code), its entries checked
    (:func:`check_chain`)."""
    state = files.read(path, "hmc-chain")
    check_chain(state, path)
    return state


def check_chain(state: dict, path) -> None:
    """Refuse a chain file whose entries no chain writes: an unknown sampler, a position or draw
    that is not a finite tensor, statistics other than the sampler's or of unequal lengths, and
    what the sampler's own check refuses of its adapted values."""
    keys = ("chain", "settings", "data", "z", "draws", "stats", "rng")
    files.require(state, keys, path)
    if not isinstance(state["draws"], dict) or not isinstance(state["settings"], dict):
        raise ValueError(f"{path}: the chain's draws or settings are not dicts")
    name = state["settings"].get("sampler", NUTS.name)
    sampler = SAMPLERS.get(name) if isinstance(name, str) else None
    if sampler is None:
        raise ValueError(f"{path}: the chain's sampler {name!r} is none of {sorted(SAMPLERS)}")
    sampler.check_adapted(state, path)
    file_checks.check_tensors(state["z"], path, "chain position z")
    stats, draws = state["stats"], state["draws"]
    if not isinstance(stats, dict) or set(stats) != set(sampler.stat_names):
        raise ValueError(f"{path}: the chain's stats are not {list(sampler.stat_names)}")
    lengths = {len(v) for v in stats.values()} | {len(v) for v in draws.values()}
    if len(lengths) > 1:
        raise ValueError(f"{path}: the chain's draws and stats differ in length {sorted(lengths)}")
    for site, values in draws.items():
        file_checks.check_tensors(dict(enumerate(values)), path, f"draws of {site!r}")
    if not isinstance(state["rng"], dict) or not torch.is_tensor(state["rng"].get("torch")):
        raise ValueError(f"{path}: the chain's generator state is not a saved torch state")


def check_against_model(state: dict, where: str, shapes: dict) -> None:
    """Refuse a chain file whose position ``z``, draws or inverse mass matrix are not of the
    model's sites and shapes, or whose generator state torch cannot take, naming ``where``."""
    z = state["z"]
    if set(z) != set(shapes):
        raise ValueError(
            f"{where}: its position holds the sites {sorted(z)}, the model's are "
            f"{sorted(shapes)}: the file is of another model, or was changed"
        )
    for name, value in z.items():
        if tuple(value.shape) != tuple(shapes[name]):
            raise ValueError(
                f"{where}: its position of {name!r} has shape {tuple(value.shape)}, the site "
                f"{tuple(shapes[name])}"
            )
    for site, values in state["draws"].items():
        wrong = {tuple(v.shape) for v in values} - {tuple(shapes.get(site, ()))}
        if site not in shapes or wrong:
            raise ValueError(
                f"{where}: its draws of {site!r} have shapes {sorted(wrong)}, not the site's "
                f"{tuple(shapes.get(site, ()))}"
            )
    for names, matrix in state.get("inverse_mass_matrix", []):
        names = [names] if isinstance(names, str) else list(names)
        if any(n not in shapes for n in names):
            raise ValueError(f"{where}: its mass matrix names sites {names} the model lacks")
        size = sum(math.prod(shapes[n]) for n in names)
        if tuple(matrix.shape) not in ((size,), (size, size)):
            raise ValueError(
                f"{where}: its inverse mass matrix of {names} has shape {tuple(matrix.shape)}, "
                f"where {size} numbers (or {size} x {size}) cover those sites"
            )
    try:
        with torch.random.fork_rng(devices=[]):
            torch.random.set_rng_state(state["rng"]["torch"])
    except (RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: its generator state is damaged ({err})") from None


def stacked(state: dict) -> tuple[dict, dict]:
    """``({site: (D, *shape)}, {stat: (D,)})`` of a chain's draws so far."""
    draws = {name: torch.stack(values) for name, values in state["draws"].items()}
    stats = {name: torch.tensor(v, dtype=torch.float64) for name, v in state["stats"].items()}
    return draws, stats


def _save(path: Path, state: dict) -> None:
    files.atomic_save(state, path)


def _count(counter, chain: int, by: int = 1) -> None:
    if counter is not None:
        counter[chain] += by


def prior_draw(model, x, y) -> dict[str, torch.Tensor]:
    """One draw of every latent site of ``model(x, y)`` from the prior (one trace, no
    gradient, the caller's random state untouched)."""
    with forked(x.device), torch.no_grad(), pyro.poutine.block():
        trace = pyro.poutine.trace(model).get_trace(x, y)
    return {
        name: site["value"]
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }
