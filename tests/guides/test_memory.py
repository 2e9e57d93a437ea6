"""A family's fit memory (guides.memory): counted on the meta device before any parameter is
allocated, equal to what the built guide holds, and a fit larger than the machine refused with
the GiB it needs, before allocating anything."""

import pytest
import torch

import guides
import zoo
from guides import memory
from tests.families import CASES


def model():
    return zoo.models.BayesianMLP(6, (5,), 3, task="classification")


def built(family, options):
    guide = guides.get(family)(model(), **options)
    guide(torch.zeros(4, 6), torch.zeros(4, dtype=torch.long))
    return guide


@pytest.mark.parametrize("label", sorted(CASES))
def test_the_meta_count_is_what_the_guide_holds(label, monkeypatch):
    """The bytes counted on the meta device at set-up are those of the built guide."""
    import guides.base

    counted = []
    original = guides.base.check_fit_memory

    def recorded(*args, **kwargs):
        counted.append(original(*args, **kwargs))
        return counted[-1]

    monkeypatch.setattr(guides.base, "check_fit_memory", recorded)
    family, options = CASES[label]
    guide = built(family, options)
    site_cls, site_options = guides.get(family).site_spec(**options)
    step = 0
    for shape in model().site_shapes.values():
        served = site_cls if site_cls is not None and site_cls.supports(shape) else None
        served = served or getattr(site_cls, "fallback", None) or guides.site.DiagonalSite
        opts = site_options if served is site_cls else {}
        step += served.step_bytes(tuple(shape), opts)
    if site_cls is None:  # a family over several sites: its point masses' count
        step = guide._step_bytes
    assert guide.fit_memory() == guide.num_variational_parameters() * 20 + step
    # a joint family's factor over its chosen scalars is checked once they are chosen
    # (guides.joint_gaussian.check_size): the sites' count is the rest
    joint = getattr(guide, "joint", None)
    shared = 0 if joint is None else sum(p.numel() for p in joint.parameters())
    assert counted == [guide.fit_memory() - 20 * shared]


def test_a_step_counts_what_each_family_draws_per_weight():
    """A draw, its noise and their gradients (20 bytes a weight) by default; point masses draw
    nothing; block diagonal's packed lower entries and WHVI's generated blocks (padded to
    ``D``) count besides."""
    from guides.families.block_diagonal import BlockDiagonalSite
    from guides.families.diagonal import DiagonalSite
    from guides.families.point_mass import PointMassSite
    from guides.families.whvi import WHVISite

    assert DiagonalSite.step_bytes((100, 10), {}) == 20 * 1000
    assert PointMassSite.step_bytes((100, 10), {}) == 12 * 1000
    # 1000 weights in 63 blocks of 16 (the last padded): 63 x 120 lower entries
    assert BlockDiagonalSite.step_bytes((100, 10), {"block_size": 16}) == 20 * 1000 + 10 * 63 * 120
    assert BlockDiagonalSite.step_bytes((100, 10), {"block_size": 1}) == 20 * 1000
    # WHVI: 100 rows of 10 columns padded to blocks of 4 (12), H dense
    assert WHVISite.step_bytes((100, 10), {"block_size": 4}) == 36 * 100 * 12
    # one block as wide as 3000 columns: D = 4096, the butterfly's 12 stages
    assert WHVISite.step_bytes((10, 3000), {"block_size": None}) == 54 * 10 * 4096


def test_site_parameters_builds_nothing_real():
    from guides.families.diagonal import DiagonalSite
    from guides.families.lowrank import LowRankSite

    assert memory.site_parameters(DiagonalSite, (1000, 1000), 0.01, {}) == 2_000_000
    assert memory.site_parameters(LowRankSite, (100, 10), 0.01, {"rank": 4}) == 6 * 1000


def test_a_fit_larger_than_the_machine_is_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(memory, "physical_memory", lambda: 1_000)
    guide = guides.get("lowrank")(model(), rank=3)
    with pytest.raises(ValueError, match=r"lowrank guide .* needs at least .* GiB .* 'fc1.weight'"):
        guide(torch.zeros(4, 6), torch.zeros(4, dtype=torch.long))
    assert not list(guide.parameters())  # nothing was allocated
    monkeypatch.setattr(memory, "physical_memory", lambda: 10**12)
    fine = guides.get("lowrank")(model(), rank=3)
    fine(torch.zeros(4, 6), torch.zeros(4, dtype=torch.long))
    assert fine.num_variational_parameters() > 0


def test_zoo_fit_refuses_it_with_the_same_message(monkeypatch):
    monkeypatch.setattr(memory, "physical_memory", lambda: 1_000)
    x, y = torch.zeros(8, 6), torch.zeros(8, dtype=torch.long)
    with pytest.raises(ValueError, match="GiB"):
        zoo.fit(model(), "matrix_normal", (x, y), num_steps=1, run=zoo.Run(progress=False))


@pytest.mark.slow  # runs child processes: the full tier
def test_the_memory_is_this_process_s_under_an_address_space_limit():
    """Under ``ulimit -v`` (here the process's size plus 2 GiB) the usable memory is what the
    limit leaves, and huge networks are refused clearly before their weights or the guide's
    parameters are allocated: a zoo network past it, and fits of a zoo network and of a
    user's module whose guides need more (they ended in the allocator's raw error)."""
    import os
    import subprocess
    import sys
    import textwrap

    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc to read the process's size")
    script = textwrap.dedent(
        """
        import resource, torch, zoo
        from torch import nn
        from guides.checks import physical_memory
        size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + 2**31, size + 2**31))
        print("usable", round(physical_memory() / 2**30, 1))
        x, y = torch.randn(4, 1000), torch.randint(0, 2, (4,))
        quiet = zoo.Run(progress=False)
        cases = [
            lambda: zoo.models.BayesianMLP(1000, (20000, 20000), 2, task="classification"),
            lambda: zoo.fit(zoo.models.BayesianMLP(1000, (4000, 4000), 2,
                            task="classification"), "lowrank", (x, y), num_steps=1, run=quiet),
            lambda: zoo.fit(zoo.models.from_module(nn.Linear(1000, 38000), task="regression"),
                            "diagonal", (x, torch.randn(4, 38000)), num_steps=1, run=quiet),
        ]
        for case in cases:
            try:
                case()
                print("built")
            except ValueError as err:
                print("refused:", str(err).split(";")[0])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "usable 2.0", lines
    assert "make a network of 4.2e+08 weights, which needs at least 15.6 GiB" in lines[1]
    assert "where this machine has 2.0 GiB" in lines[1]
    assert lines[2].startswith("refused: a lowrank guide of this model holds")
    assert lines[3].startswith("refused: a diagonal guide of this model holds")
