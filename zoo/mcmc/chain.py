"""One NUTS chain on a zoo model, run in chunks with a checkpoint after each: the engine under
:func:`zoo.reference.reference`.

The sampler is Pyro's own ``pyro.infer.mcmc.NUTS`` kernel, driven as ``pyro.infer.MCMC`` drives
it (``setup``, then ``sample`` once per transition, then the kernel's ``transforms`` to the
constrained space), one chunk of transitions at a time so that a long run can stop and resume.
Warm-up (step-size and diagonal mass-matrix adaptation) is one chunk; after it, each chunk of
draws ends with a checkpoint holding the chain's unconstrained position, the adapted step size
and inverse mass matrix, the draws so far and torch's generator state. A resumed chain rebuilds
the kernel from those, with adaptation off, and restores the generator, so it continues with
exactly the draws the uninterrupted chain makes.

Per draw the chain records what ArviZ reads as ``sample_stats``: ``diverging``, ``tree_depth``
(number of trajectory doublings), ``step_size``, ``energy`` (the Hamiltonian at the start of the
transition), ``lp`` (the log joint density in the unconstrained space, Jacobian included:
``-potential energy``) and ``acceptance_rate`` (the transition's mean Metropolis acceptance).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import pyro
import torch
from pyro.infer.autoguide.initialization import init_to_sample
from pyro.infer.mcmc import NUTS
from pyro.poutine.util import site_is_subsample

from zoo.runtime import file_checks, files
from zoo.runtime.rng import forked, seeded

#: The per-draw statistics each chain records, in ArviZ's ``sample_stats`` names.
STAT_NAMES = ("diverging", "tree_depth", "step_size", "energy", "lp", "acceptance_rate")


@dataclass(frozen=True)
class ChainSettings:
    """What one chain does: ``warmup`` adaptation transitions, then ``draws`` kept ones in
    chunks of ``chunk``, from ``seed``; NUTS' ``target_accept`` and ``max_tree_depth``;
    ``jit``: trace the potential with ``torch.jit`` (Pyro's ``jit_compile``, several times
    faster per gradient on small networks)."""

    warmup: int
    draws: int
    chunk: int
    seed: int
    target_accept: float = 0.8
    max_tree_depth: int = 10
    jit: bool = True


class _RecordingNUTS(NUTS):
    """Pyro's NUTS, also keeping the start energy and the tree depth of its last transition."""

    def _sample_r(self, name):
        r, r_unscaled = super()._sample_r(name)
        kinetic = self._kinetic_energy(r_unscaled)
        self.last_energy = float(kinetic + self._potential_energy_last)
        self.last_depth = 0
        return r, r_unscaled

    def _build_tree(self, z, r, z_grads, log_slice, direction, tree_depth, energy_current):
        self.last_depth = max(self.last_depth, tree_depth + 1)
        return super()._build_tree(z, r, z_grads, log_slice, direction, tree_depth, energy_current)


def chain_path(folder: Path, chain: int) -> Path:
    """Where chain ``chain``'s checkpoint lives in ``folder``."""
    return Path(folder) / f"chain{chain}.pt"


def run_chain(model, x, y, settings: ChainSettings, chain: int, folder: Path, counter=None):
    """Run (or resume) chain ``chain`` to ``settings.draws`` draws, checkpointing into
    ``folder``; ``counter[chain]`` (a shared array, optional) counts finished transitions."""
    path = chain_path(folder, chain)
    state = read_chain(path) if path.exists() else None
    if state is not None:
        check_resumable(state, settings, chain, x, y)
        if len(state["stats"]["lp"]) >= settings.draws:
            return
    seed = settings.seed * 1_000_003 + chain
    with warnings.catch_warnings(), seeded(seed, x.device):
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.trace's deprecation notice
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        if state is None:
            kernel = _kernel(model, settings)
            kernel.setup(settings.warmup, x, y)
            z = {k: v.detach() for k, v in kernel.initial_params.items()}
            for _ in range(settings.warmup):
                z = kernel.sample(z)
                _count(counter, chain)
            state = _state(kernel, z, settings, chain, x, y)
            _save(path, state)
        else:
            _count(counter, chain, settings.warmup + len(state["stats"]["lp"]))
            kernel = _resumed_kernel(model, settings, state, x, y)
            z = dict(state["z"])
            files.set_torch_rng_state(state["rng"])
        while len(state["stats"]["lp"]) < settings.draws:
            todo = min(settings.chunk, settings.draws - len(state["stats"]["lp"]))
            z = _draw_chunk(kernel, z, todo, state, counter, chain)
            state["z"] = z
            state["rng"] = files.torch_rng_state()
            _save(path, state)


def _kernel(model, settings: ChainSettings, **options) -> _RecordingNUTS:
    return _RecordingNUTS(
        model,
        target_accept_prob=settings.target_accept,
        max_tree_depth=settings.max_tree_depth,
        jit_compile=settings.jit,
        ignore_jit_warnings=True,
        init_strategy=init_to_sample,
        **options,
    )


def _resumed_kernel(model, settings: ChainSettings, state: dict, x, y) -> _RecordingNUTS:
    """A kernel at the adapted step size and mass matrix, adaptation off, at ``state["z"]``."""
    kernel = _kernel(
        model,
        settings,
        step_size=state["step_size"],
        adapt_step_size=False,
        adapt_mass_matrix=False,
    )
    kernel.initial_params = dict(state["z"])
    kernel.setup(0, x, y)
    kernel.mass_matrix_adapter.inverse_mass_matrix = {
        tuple(names): value for names, value in state["inverse_mass_matrix"]
    }
    return kernel


def _draw_chunk(kernel, z, todo: int, state: dict, counter, chain: int) -> dict:
    """``todo`` transitions; each draw (constrained) and its statistics appended to ``state``."""
    stats, draws = state["stats"], state["draws"]
    for _ in range(todo):
        divergences, mean_accept = len(kernel._divergences), kernel._mean_accept_prob
        z = kernel.sample(z)
        n = kernel._t - kernel._warmup_steps  # post-warm-up transitions of this kernel
        stats["diverging"].append(float(len(kernel._divergences) > divergences))
        stats["tree_depth"].append(float(kernel.last_depth))
        stats["step_size"].append(float(kernel.step_size))
        stats["energy"].append(kernel.last_energy)
        stats["lp"].append(-float(kernel._potential_energy_last))
        stats["acceptance_rate"].append(n * kernel._mean_accept_prob - (n - 1) * mean_accept)
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
        "settings": asdict(settings),
        "data": data_fingerprint(x, y),
        "z": z,
        "step_size": float(kernel.step_size),
        "inverse_mass_matrix": [
            [list(names), value] for names, value in kernel.inverse_mass_matrix.items()
        ],
        "draws": {},
        "stats": {name: [] for name in STAT_NAMES},
        "rng": files.torch_rng_state(),
    }


def data_fingerprint(x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """Sizes and sums of the data, so that a checkpoint is resumed on the data it was run on."""
    return [float(x.shape[0]), float(x.double().sum()), float(y.double().sum())]


def check_resumable(state: dict, settings: ChainSettings, chain: int, x, y) -> None:
    """Refuse a checkpoint of another run: other data, seed, warm-up or kernel settings."""
    saved = dict(state["settings"])
    now = asdict(settings)
    differ = [k for k in now if k not in ("draws", "chunk") and saved.get(k) != now[k]]
    if differ:
        raise ValueError(
            f"the checkpoint of chain {chain} was run with other settings "
            f"({', '.join(f'{k}={saved.get(k)!r} now {now[k]!r}' for k in differ)}): pass the "
            "same ones to resume it, or another checkpoint folder to start afresh"
        )
    if state["data"] != data_fingerprint(x, y):
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
    """Refuse a chain file whose entries no chain writes: a position or draw that is not a
    finite tensor, a step size that is not a positive number, statistics of unequal lengths."""
    keys = ("chain", "settings", "data", "z", "step_size", "inverse_mass_matrix", "draws")
    files.require(state, (*keys, "stats", "rng"), path)
    file_checks.check_tensors(state["z"], path, "chain position z")
    step = state["step_size"]
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step < float("inf"):
        raise ValueError(f"{path}: the chain's step size is {step!r}, not a positive number")
    stats = state["stats"]
    if not isinstance(stats, dict) or set(stats) != set(STAT_NAMES):
        raise ValueError(f"{path}: the chain's stats are not {list(STAT_NAMES)}")
    lengths = {len(v) for v in stats.values()}
    draws = state["draws"]
    if not isinstance(draws, dict) or not isinstance(state["settings"], dict):
        raise ValueError(f"{path}: the chain's draws or settings are not dicts")
    lengths |= {len(v) for v in draws.values()}
    if len(lengths) > 1:
        raise ValueError(f"{path}: the chain's draws and stats differ in length {sorted(lengths)}")
    for name, values in draws.items():
        file_checks.check_tensors(dict(enumerate(values)), path, f"draws of {name!r}")
    matrix = state["inverse_mass_matrix"]
    if not isinstance(matrix, list) or not all(len(item) == 2 for item in matrix):
        raise ValueError(f"{path}: the chain's inverse mass matrix is not [[names, tensor], ...]")
    file_checks.check_tensors({str(n): v for n, v in matrix}, path, "inverse mass matrix")
    if not isinstance(state["rng"], dict) or not torch.is_tensor(state["rng"].get("torch")):
        raise ValueError(f"{path}: the chain's generator state is not a saved torch state")


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
