"""zoo.training.option_names: an option given to the wrong group is refused, before any work,
with the place it belongs."""

import typing

import pytest

import zoo
from zoo.training.keywords import HowToFit
from zoo.training.option_names import FIT_KEYWORDS
from zoo.training.options import GROUPS


def test_fit_keywords_are_how_to_fits_keys_less_the_groups():
    keys = set(typing.get_type_hints(HowToFit)) - set(GROUPS)
    assert set(FIT_KEYWORDS) == keys


@pytest.mark.parametrize(
    "call,said",
    [
        (lambda: zoo.Optim(lr=0.01), r"zoo.Optim has no option \['lr'\]: 'lr' is zoo.fit's own: "
         r"zoo.fit\(\.\.\., lr=\.\.\.\)"),
        (lambda: zoo.Loss(epochs=3), r"'epochs' is zoo.fit's own"),
        (lambda: zoo.Run(jit=False), r"'jit' belongs to zoo.Engine: zoo.Engine\(jit=\.\.\.\)"),
        (lambda: zoo.Engine(kl_weight=0.5), r"'kl_weight' belongs to zoo.Loss"),
        (lambda: zoo.Optim(optimiser="sgd"), r"'optimiser' is no option \(did you mean "
         r"'optimizer'\?\)\. Its options: optimizer, "),
        (lambda: zoo.Run(nonsense=1, progres=False), r"\['nonsense', 'progres'\]: 'nonsense' is "
         r"no option; 'progres' is no option \(did you mean 'progress'\?\)"),
    ],
)  # fmt: skip
def test_a_misplaced_option_names_where_it_belongs(call, said):
    with pytest.raises(TypeError, match=said):
        call()


def test_a_fits_group_given_as_a_dict_says_the_same_before_any_work():
    with pytest.raises(TypeError, match=r"'lr' is zoo.fit's own"):
        zoo.fit(object(), "diagonal", None, optim={"lr": 0.01})


def test_groups_still_copy_compare_and_pickle():
    import copy
    import dataclasses
    import pickle

    optim = zoo.Optim(per_example=True, clip_grad_norm=1.0)
    assert pickle.loads(pickle.dumps(optim)) == optim == copy.deepcopy(optim)
    assert dataclasses.replace(optim, per_example=False).clip_grad_norm == 1.0
    assert zoo.Run(progress=False) == zoo.Run(progress=False)
