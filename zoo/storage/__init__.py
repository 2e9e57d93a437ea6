"""The file format of everything the library writes: plain data that loads without unpickling
code, written atomically, with a checksum (:mod:`~zoo.storage.files`), the checks of what a
file holds before anything is built from it (:mod:`~zoo.storage.checks`), and the saved forms
of a model and a guide, each written, checked and rebuilt in one module
(:mod:`~zoo.storage.model_form`, :mod:`~zoo.storage.guide_form`)."""
