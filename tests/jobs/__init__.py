"""Scripts the tests run as processes of their own (torchrun, ``python``); a test imports one
only to reuse its model, data or task in-process, so both sides train the same thing."""
