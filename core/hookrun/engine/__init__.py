"""The Runner and its loop: the position, train and evaluation loops, the step, stop
signals, reporting."""
