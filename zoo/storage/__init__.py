"""The file format of everything the library writes: plain data that loads without unpickling
code, written atomically, with a checksum (:mod:`~zoo.storage.files`), and the checks of what a
file holds before anything is built from it (:mod:`~zoo.storage.checks`)."""
