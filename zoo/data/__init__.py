"""Data: the sets (:mod:`zoo.data.sets`), the forms data come in (:mod:`zoo.data.forms`), the
checks of data in every form the library takes (:mod:`zoo.data.checks`) and a fit's minibatches
(:mod:`zoo.data.batches`)."""

from zoo.data.sets import (
    cifar10,
    data_root,
    fashion_mnist,
    files_where,
    mnist,
    toy_function,
    toy_regression,
)

__all__ = [
    "cifar10",
    "data_root",
    "fashion_mnist",
    "files_where",
    "mnist",
    "toy_function",
    "toy_regression",
]
