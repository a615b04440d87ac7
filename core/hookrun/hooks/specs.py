"""The hook points of hookrun, one pluggy hookspec each.

This module is the reference: every docstring says when the hook fires, what it
receives, what a hook may change, and shows an example. ``hookrun hooks`` prints it and
the documentation's hook reference is generated from it. Hooks are called with keyword
arguments only; an implementation may accept any subset of the spec's arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from hookrun.hooks.protocol import RunnerProtocol

hookspec = pluggy.HookspecMarker("hookrun")


def chained(argument: str) -> Any:
    """Mark a hook point whose implementations pass ``argument`` along: each non-None
    return replaces it for the next implementation, and the call returns the last value."""

    def mark(spec: Any) -> Any:
        spec.hookrun_chained = argument
        return spec

    return mark


@hookspec
def before_run(runner: RunnerProtocol) -> None:
    """Fires once at the start of ``train()``, ``val()`` or ``test()``, before any state is
    restored from a checkpoint.

    Arguments: ``runner``.
    A hook may: set up files, handlers and plugin-side buffers; point
    ``runner.checkpoint_dir`` at another folder before ``resume="auto"`` looks there.
    Setup here must be safe to repeat: ``val()`` after ``train()`` fires it again.

    Example::

        @hookimpl
        def before_run(self, runner):
            self.out = runner.work_dir / "predictions"
            self.out.mkdir(parents=True, exist_ok=True)
    """


@hookspec
def after_run(runner: RunnerProtocol) -> None:
    """Fires once at the end of ``train()``, ``val()`` or ``test()``, also after
    ``stop_training``; not after an exception (``on_exception`` fires instead).

    Arguments: ``runner``.
    A hook may: flush and close what it opened, print summaries, wait for background work.

    Example::

        @hookimpl
        def after_run(self, runner):
            print(f"finished at iteration {runner.iter}")
    """


@hookspec
def before_train(runner: RunnerProtocol) -> None:
    """Fires after ``before_run`` and after any resume, right before the first epoch.

    Arguments: ``runner``; ``runner.iter`` and ``runner.epoch`` already hold the resumed
    position.
    A hook may: read the starting position, start clocks, build state that needs the
    restored weights (an EMA shadow, for example).

    Example::

        @hookimpl
        def before_train(self, runner):
            self.start_iter = runner.iter
    """


@hookspec
def after_train(runner: RunnerProtocol) -> None:
    """Fires after the last epoch (or after ``stop_training``), before ``after_run``.

    Arguments: ``runner``.
    A hook may: write final checkpoints or reports.

    Example::

        @hookimpl
        def after_train(self, runner):
            runner.save_checkpoint(runner.work_dir / "final.pt")
    """


@hookspec
def before_train_epoch(runner: RunnerProtocol) -> None:
    """Fires at the start of each training epoch (each pass over the data in iteration-based
    runs), also when a run resumes in the middle of that epoch.

    Arguments: ``runner``; ``runner.epoch`` is the epoch starting (0-based).
    A hook may: adjust per-epoch settings (augmentation strength, sampler state).

    Example::

        @hookimpl
        def before_train_epoch(self, runner):
            runner.train_dataloader.dataset.strength = min(1.0, runner.epoch / 10)
    """


@hookspec
def after_train_epoch(runner: RunnerProtocol) -> None:
    """Fires after the last iteration of an epoch and after an epoch-wise scheduler step,
    before that epoch's validation.

    Arguments: ``runner``; ``runner.epoch`` is the epoch finishing.
    A hook may: save epoch checkpoints, recompute statistics, set ``stop_training``.

    Example::

        @hookimpl
        def after_train_epoch(self, runner):
            if runner.every_n_epochs(5):
                runner.save_checkpoint(runner.work_dir / f"epoch_{runner.epoch + 1}.pt")
    """


@hookspec
@chained("batch")
def transform_batch(runner: RunnerProtocol, batch: Any, mode: str) -> Any:
    """Fires for every batch of training, validation, test and prediction, once it is on the
    runner's device and before ``before_{mode}_iter`` and the step.

    Arguments: ``runner``; ``batch``, as the previous implementation left it; ``mode``,
    ``"train"``, ``"val"``, ``"test"`` or ``"predict"``.
    Return: a new batch, which replaces ``batch`` for the next implementation (in priority
    order) and the step; None leaves the batch as it is. The call returns the final batch.
    A hook may: augment on the GPU, build masks, drop fields the model does not take.

    Example::

        @hookimpl
        def transform_batch(self, runner, batch, mode):
            if mode == "train":
                images, labels = batch
                return images.flip(-1), labels
    """


@hookspec
def before_train_iter(runner: RunnerProtocol, batch_idx: int, batch: Any) -> None:
    """Fires before the forward pass of every training iteration; ``batch`` is already on
    the runner's device.

    Arguments: ``runner``; ``batch_idx``, the iteration's index within its epoch;
    ``batch``, the batch as the model will see it.
    A hook may: read the batch, start timers. Keep it cheap: it runs every iteration.

    Example::

        @hookimpl
        def before_train_iter(self, runner, batch_idx):
            self.t0 = time.perf_counter()
    """


@hookspec
def after_train_iter(
    runner: RunnerProtocol, batch_idx: int, batch: Any, outputs: dict[str, Any]
) -> None:
    """Fires at the end of every training iteration, after the optimizer step hooks (and an
    iteration-wise scheduler) and before the core's report and any validation due.

    Arguments: ``runner``; ``batch_idx``; ``batch``; ``outputs``, a dict of detached loss
    tensors with ``"loss"`` first. Reading a tensor's value forces a device sync: put it
    in ``runner.scalars`` and read it at a logging interval instead.
    A hook may: update averages of weights, record scalars, save checkpoints, set
    ``stop_training``.

    Example::

        @hookimpl
        def after_train_iter(self, runner, outputs):
            runner.scalars.put("train/loss_x2", outputs["loss"] * 2)
    """


@hookspec
def before_backward(runner: RunnerProtocol, loss: Any) -> None:
    """Fires before every backward pass, after the forward.

    Arguments: ``runner``; ``loss``, the tensor about to be back-propagated (already divided
    by ``grad_accum``, not yet scaled by AMP's GradScaler). Reading its value forces a sync.
    A hook may: add a regulariser's gradients later, record the loss on the device.

    Example::

        @hookimpl
        def before_backward(self, runner, loss):
            runner.scalars.put("train/scaled_loss", loss.detach())
    """


@hookspec
def after_backward(runner: RunnerProtocol) -> None:
    """Fires after every backward pass; gradients of the accumulation group so far are in
    ``.grad`` (scaled by AMP's GradScaler under ``amp: fp16``).

    Arguments: ``runner``.
    A hook may: inspect or edit gradients (an inf written here is what a NaN guard catches).

    Example::

        @hookimpl
        def after_backward(self, runner):
            self.backward_passes += 1
    """


@hookspec
def before_optimizer_step(runner: RunnerProtocol, optimizer: Any, optimizer_name: str) -> Any:
    """Fires before each optimizer's step: in automatic optimization at an accumulation
    boundary (every ``grad_accum``-th batch of an epoch, and its last batch) once per
    optimizer, in manual optimization at each ``optim.step(name)``; after AMP unscaled the
    gradients and before clipping and the step.

    Arguments: ``runner``; ``optimizer``, the optimizer about to step; ``optimizer_name``,
    its name in ``runner.optimizers`` (``"main"`` when there is one).
    Return: ``False`` skips this step: the weights stay as they are, the gradients are
    zeroed, ``after_optimizer_step`` does not fire. Any other return value steps.
    A hook may: check or edit gradients, skip a bad step.

    Example::

        @hookimpl
        def before_optimizer_step(self, runner, optimizer):
            grads = [p.grad for g in optimizer.param_groups for p in g["params"]]
            norms = torch._foreach_norm([g for g in grads if g is not None])
            return bool(torch.stack(norms).isfinite().all())  # one host read
    """


@hookspec
def after_optimizer_step(runner: RunnerProtocol, optimizer: Any, optimizer_name: str) -> None:
    """Fires right after an optimizer stepped, only when it did (not for a skipped step),
    before its gradients are zeroed and its per-iteration scheduler steps.

    Arguments: ``runner``; ``optimizer``; ``optimizer_name``, its name in
    ``runner.optimizers``.
    A hook may: update an average of the weights (EMA does, once per optimizer step),
    count steps, read gradients one last time.

    Example::

        @hookimpl
        def after_optimizer_step(self, runner):
            self.steps += 1
    """


@hookspec
def after_report(runner: RunnerProtocol, scalars: dict[str, float], step: int) -> None:
    """Fires on rank 0 after the core sent a training report to every writer: every
    ``log_interval`` iterations, at each epoch's end and after the last iteration.

    Arguments: ``runner``; ``scalars``, the host floats just written (``train/loss``
    smoothed over the interval, ``train/lr``, gauges such as the timer's) plus
    ``train/eta``, the seconds left, which no writer gets (a moment's estimate for the
    console); ``step``, the number of completed iterations.
    A hook may: render them (the logger plugin prints its console lines here), forward them
    elsewhere. It costs nothing between reports.

    Example::

        @hookimpl
        def after_report(self, scalars, step):
            print(step, scalars["train/loss"])
    """


@hookspec
def before_val(runner: RunnerProtocol) -> None:
    """Fires before a validation pass, both inside ``train()`` and from ``runner.val()``.

    Arguments: ``runner``.
    A hook may: swap evaluation weights in (they must be swapped back in ``after_val``
    and in ``on_exception``). ``after_val`` runs hooks in the same order as ``before_val``,
    not in reverse, so swaps go through the model's ``hookrun.swap_stack``: it swaps out
    newest first whatever order the plugins ask in, and several plugins' swaps nest.

    Example::

        @hookimpl
        def before_val(self, runner):
            swap_stack(runner.unwrapped_model).push(self.swap)  # has swap_in / swap_out
    """


@hookspec
def after_val(runner: RunnerProtocol) -> None:
    """Fires after a validation pass, after ``after_val_epoch``; also when a stop signal cut
    the pass short (then ``after_val_epoch`` did not fire).

    Arguments: ``runner``.
    A hook may: restore what ``before_val`` changed (swapped weights: through
    ``hookrun.swap_stack``, which unwinds swaps pushed after this one first).

    Example::

        @hookimpl
        def after_val(self, runner):
            swap_stack(runner.unwrapped_model).remove(self.swap)
    """


@hookspec
def before_val_epoch(runner: RunnerProtocol) -> None:
    """Fires right before the validation loop starts, after ``before_val``.

    Arguments: ``runner``.
    A hook may: reset per-pass accumulators.

    Example::

        @hookimpl
        def before_val_epoch(self, runner):
            self.confusion.zero_()
    """


@hookspec
def after_val_epoch(runner: RunnerProtocol, metrics: dict[str, float]) -> None:
    """Fires with the validation metrics of the whole pass (averaged over samples and, under
    torch.distributed, over ranks).

    Arguments: ``runner``; ``metrics``, a dict of metric name to float; with several named
    validation sets (``val_dataloader`` a mapping) one pass covers them all and the names
    are ``<set>/<metric>`` (written as ``val/<set>/<metric>``).
    A hook may: add or rename entries of ``metrics`` in place (hooks with a higher
    priority run first and later ones see the change); save best checkpoints; set
    ``stop_training``.

    Example::

        @hookimpl
        def after_val_epoch(self, runner, metrics):
            metrics["error"] = 1.0 - metrics["accuracy"]
    """


@hookspec
def before_val_iter(runner: RunnerProtocol, batch_idx: int, batch: Any) -> None:
    """Fires before each validation batch's forward pass.

    Arguments: ``runner``; ``batch_idx``; ``batch`` (on the device).
    A hook may: read the batch.

    Example::

        @hookimpl
        def before_val_iter(self, runner, batch_idx):
            self.t0 = time.perf_counter()
    """


@hookspec
def after_val_iter(
    runner: RunnerProtocol, batch_idx: int, batch: Any, outputs: dict[str, Any]
) -> None:
    """Fires after each validation batch.

    Arguments: ``runner``; ``batch_idx``; ``batch``; ``outputs``, the batch's metric
    values (tensors or floats) as the model or the metric functions returned them.
    A hook may: collect predictions, write images.

    Example::

        @hookimpl
        def after_val_iter(self, runner, batch_idx, outputs):
            self.seen += 1
    """


@hookspec
def before_test(runner: RunnerProtocol) -> None:
    """Fires before a test pass (``runner.test()``); as ``before_val`` for the test set.

    Arguments: ``runner``.
    A hook may: swap evaluation weights in (through ``hookrun.swap_stack``, as for
    ``before_val``).

    Example::

        @hookimpl
        def before_test(self, runner):
            swap_stack(runner.unwrapped_model).push(self.swap)
    """


@hookspec
def after_test(runner: RunnerProtocol) -> None:
    """Fires after a test pass, after ``after_test_epoch``.

    Arguments: ``runner``.
    A hook may: restore what ``before_test`` changed.

    Example::

        @hookimpl
        def after_test(self, runner):
            swap_stack(runner.unwrapped_model).remove(self.swap)
    """


@hookspec
def before_test_epoch(runner: RunnerProtocol) -> None:
    """Fires right before the test loop starts.

    Arguments: ``runner``.
    A hook may: reset accumulators.

    Example::

        @hookimpl
        def before_test_epoch(self, runner):
            self.predictions = []
    """


@hookspec
def after_test_epoch(runner: RunnerProtocol, metrics: dict[str, float]) -> None:
    """Fires with the test metrics of the whole pass.

    Arguments: ``runner``; ``metrics`` (may be edited in place, as in ``after_val_epoch``).
    A hook may: add entries, write reports.

    Example::

        @hookimpl
        def after_test_epoch(self, runner, metrics):
            (runner.work_dir / "test.json").write_text(json.dumps(metrics))
    """


@hookspec
def before_test_iter(runner: RunnerProtocol, batch_idx: int, batch: Any) -> None:
    """Fires before each test batch's forward pass.

    Arguments: ``runner``; ``batch_idx``; ``batch``.
    A hook may: read the batch.

    Example::

        @hookimpl
        def before_test_iter(self, runner, batch):
            self.last_batch = batch
    """


@hookspec
def after_test_iter(
    runner: RunnerProtocol, batch_idx: int, batch: Any, outputs: dict[str, Any]
) -> None:
    """Fires after each test batch.

    Arguments: ``runner``; ``batch_idx``; ``batch``; ``outputs`` (the batch's metric values).
    A hook may: collect predictions.

    Example::

        @hookimpl
        def after_test_iter(self, runner, outputs):
            self.values.append(outputs["accuracy"])
    """


@hookspec
def before_predict(runner: RunnerProtocol) -> None:
    """Fires at the start of ``runner.predict()`` (and ``hookrun predict``), with the model
    already in eval mode. Prediction is not a run: ``before_run``/``after_run`` do not fire,
    no writer opens and no scalar is written.

    Arguments: ``runner``; ``runner.mode`` is ``"predict"``.
    A hook may: swap other weights in (``hookrun.swap_stack``, as for ``before_test``),
    open a file to stream outputs into.

    Example::

        @hookimpl
        def before_predict(self, runner):
            self.rows = 0
    """


@hookspec
def after_predict(runner: RunnerProtocol, outputs: Any) -> None:
    """Fires at the end of a prediction pass, on every rank, with all the outputs.

    Arguments: ``runner``; ``outputs``, what ``runner.predict`` returns (every rank's,
    in the loader's order; docs/predict.md says how batches are put together).
    A hook may: restore what ``before_predict`` changed, write the outputs somewhere.

    Example::

        @hookimpl
        def after_predict(self, runner, outputs):
            if runner.is_main:
                torch.save(outputs, runner.work_dir / "predictions.pt")
    """


@hookspec
def before_predict_iter(runner: RunnerProtocol, batch_idx: int, batch: Any) -> None:
    """Fires before each prediction batch's forward, after ``transform_batch`` (mode
    ``"predict"``).

    Arguments: ``runner``; ``batch_idx``, the batch's index on this rank; ``batch``, on the
    runner's device.
    A hook may: read the batch.

    Example::

        @hookimpl
        def before_predict_iter(self, runner, batch):
            self.rows += len(batch[0])
    """


@hookspec
def after_predict_iter(runner: RunnerProtocol, batch_idx: int, batch: Any, outputs: Any) -> None:
    """Fires after each prediction batch, on the rank that predicted it.

    Arguments: ``runner``; ``batch_idx``; ``batch``; ``outputs``, this batch's output
    (``predict_step(batch)`` or the forward) moved to the CPU.
    A hook may: stream outputs to disk instead of keeping them, count, time.

    Example::

        @hookimpl
        def after_predict_iter(self, runner, batch_idx, outputs):
            self.sink.write(outputs.argmax(1).tolist())
    """


@hookspec
def before_save_checkpoint(runner: RunnerProtocol, checkpoint: dict[str, Any]) -> None:
    """Fires with the checkpoint dict after every state (plugins' included) was collected
    and before it is written.

    Arguments: ``runner``; ``checkpoint``, the dict about to be written (format in
    :mod:`hookrun.checkpoint.files`).
    A hook may: add or edit entries. Values must load with ``torch.load(...,
    weights_only=True)``: tensors, numbers, strings, lists, tuples and dicts only.

    Example::

        @hookimpl
        def before_save_checkpoint(self, checkpoint):
            checkpoint["meta"]["git_commit"] = self.commit
    """


@hookspec(firstresult=True)
def save_on_stop(runner: RunnerProtocol, signum: int) -> Any:
    """Asked once when a stop signal (``runner.stop_signals``: SIGTERM, SIGINT, ...) ends
    training, at an iteration boundary of training or validation: the position and the
    weights agree, and a save now resumes exactly. Fires on every rank.

    Arguments: ``runner``; ``signum``, the signal's number.
    Return: the path of the checkpoint saved (the first hook that returns one wins), or
    None to leave the save to the next hook; when none saves, the core writes
    ``<checkpoint_dir>/stop_iter_<N>.pt``. After it, training ends (``after_train_epoch``,
    ``after_train``, ``after_run``) and the process ends by the signal.

    Example::

        @hookimpl
        def save_on_stop(self, runner, signum):
            return runner.save_checkpoint(runner.checkpoint_dir / "preempted.pt")
    """


@hookspec
def after_load_checkpoint(runner: RunnerProtocol, checkpoint: dict[str, Any]) -> None:
    """Fires after a checkpoint was loaded and every state (model, optimizer, scheduler,
    loop position, RNG and plugins' states) was restored.

    Arguments: ``runner``; ``checkpoint``, the loaded dict.
    A hook may: migrate old entries, rebuild derived state.

    Example::

        @hookimpl
        def after_load_checkpoint(self, runner, checkpoint):
            print("resumed at iteration", checkpoint["meta"]["iter"])
    """


@hookspec
def on_exception(runner: RunnerProtocol, exception: BaseException) -> None:
    """Fires when ``train()``, ``val()`` or ``test()`` raises, before the exception
    propagates unchanged. ``KeyboardInterrupt`` included.

    Arguments: ``runner``; ``exception``.
    A hook may: save an emergency checkpoint, restore swapped weights, release resources.
    An exception raised by this hook is reported and does not replace the original one.

    Example::

        @hookimpl
        def on_exception(self, runner, exception):
            runner.save_checkpoint(runner.work_dir / "crash.pt")
    """


@hookspec
def extra_models(runner: RunnerProtocol) -> dict[str, Any]:  # type: ignore[empty-body]
    """Asked for the extra models a plugin keeps beside ``runner.model``, such as an EMA
    copy, so that other plugins can act on them without importing that plugin.

    Arguments: ``runner``.
    Return: a dict of name to a context manager factory: ``factory()`` enters a state where
    ``runner.unwrapped_model`` holds that model's weights and leaves it restored
    afterwards (swapping through ``hookrun.swap_stack``, so it nests with evaluation's
    swaps). Results of all hooks are merged: name each model after the plugin (``self.name``)
    so that two instances of one plugin class do not hide each other.

    Example::

        @hookimpl
        def extra_models(self, runner):
            return {self.name: self.swapped_in}
    """
