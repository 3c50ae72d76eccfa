"""What the tests share: drivers run as processes, fakes and servers, fixtures that start
them, and helpers used by more than one test module; imported as `tests.support.<module>`
(the repository's root is on sys.path through pyproject's pytest ``pythonpath``). Each module
is named by what it holds; README.md here lists them, one line each."""
