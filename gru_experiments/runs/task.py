"""Training any LanguageModel (models/protocol.py) with Lightning: loss, optimiser, schedule, metrics, checkpoints."""

import math
import time

import lightning as L
import torch
import torch.nn.functional as F

from gru_experiments.data.tokenizers import plain_tokens, tokenizer_from_state
from gru_experiments.errors import TrainingDiverged, UserError
from gru_experiments.models import cuda_graphs
from gru_experiments.models.cuda_graphs import GraphedTrainingStep
from gru_experiments.models.protocol import build_model, map_state
from gru_experiments.runs.checkpoints import read_checkpoint
from gru_experiments.runs.recipe import Recipe
from gru_experiments.study.scores import Score, score_batch

GRAPH_DEVICE = "cuda"  # where cuda_graphs applies (a test emulates capture on the CPU)
DIVERGENCE_FACTOR = 4  # a training loss above 4 x ln(vocabulary) nats stops the run (divergence_limit)


class LanguageModelTask(L.LightningModule):
    """Wraps any LanguageModel; checkpoints hold its architecture and tokenizer, so `load_checkpoint` needs no
    config. lr, optim and epochs (a record) are a trained model's recipe."""

    def __init__(self, architecture: dict, vocab_size: int, lr: float | None = None, optim: dict | None = None,
                 epochs: int | None = None, model_name: str = "model", tokenizer=None, from_checkpoint: bool = False):
        super().__init__()
        self.recipe = Recipe.from_config(optim) if optim is not None else None  # None: a counted model
        self.save_hyperparameters(ignore=["tokenizer", "from_checkpoint"])
        self.model = build_model(architecture, vocab_size, from_checkpoint=from_checkpoint)
        self.tokenizer = tokenizer
        lengths = tokenizer.token_char_lengths if tokenizer is not None else torch.ones(vocab_size, dtype=torch.long)
        self.register_buffer("token_char_lengths", lengths.clone(), persistent=False)
        # The validation split is plain text: scored over the corpus's own symbols (a probe's are left out).
        self.register_buffer("plain_tokens", plain_tokens(tokenizer), persistent=False)
        self._val_score = Score()
        self.last_val_score: Score | None = None  # the latest validation pass, and the step it ran at
        self.last_val_step = -1
        self._epoch_loss = [0.0, 0]  # sum, count: the current (or last) epoch's training losses
        self.train_tokens = 0
        self.train_seconds = 0.0
        self.carried_state = None  # training=streams: the state after the last chunk, detached
        self.recall_cue, self.recall_weight = None, 1.0  # weigh_recall
        self.graphed_step = None  # on_train_start builds it where cuda_graphs applies
        self.run_config: dict | None = None  # the run's config (unresolved), kept in its checkpoints for a resume
        self.corpus_sha256: str | None = None  # the corpus's (data/corpus.py), kept in its checkpoints for a resume

    def weigh_recall(self, cue: int, weight: float) -> None:
        """probe=recall: each recall target (after `cue`) weighs `weight` times another in the loss (the transformer's
        control: its copying forms only where recall is a large enough share of the loss)."""
        self.recall_cue, self.recall_weight = cue, float(weight)

    # --- training -------------------------------------------------------------------
    def on_train_batch_start(self, batch, batch_idx) -> None:
        # Not in on_train_epoch_start: Lightning 2.4 calls it again on a mid-epoch resume (after on_load_checkpoint
        # restored the sums), and 2.5+ skips it for the epoch after a resume from an epoch's last batch.
        if batch_idx == 0:
            self._epoch_loss = [0.0, 0]
        self._step_started = time.perf_counter()

    def training_step(self, batch, batch_idx):
        # windows: (inputs, targets), from the initial state; streams (truncated BPTT): (inputs, targets,
        # starts_pass), the previous chunk's state carried unless the chunk starts a pass.
        inputs, targets, *streams = batch
        carry = bool(streams) and not streams[0]
        state = self.carried_state if carry else None
        if self.graphed_step is not None:  # forward and backward replayed from a CUDA graph: the grads in place
            loss, state = self.graphed_step(inputs, targets, state)
        else:
            loss, state = self.training_loss(inputs, targets, state)
        if streams:
            self.carried_state = map_state(torch.Tensor.detach, state)  # truncated BPTT stops at the chunk
        if not loss <= self.divergence_limit:  # nan and inf fail it too; one device sync, as isfinite's
            # Stop before the update, so the weights (and any checkpoint) stay those of the last good step.
            above = (f", above {DIVERGENCE_FACTOR} x ln {self.model.vocab_size} = {self.divergence_limit:.1f} nats "
                     f"({DIVERGENCE_FACTOR} times a uniform guess's, where training starts)"
                     if torch.isfinite(loss) else "")
            raise TrainingDiverged(f"training diverged: the loss is {loss.item():.4g} at training step "
                                   f"{self.global_step + 1} (epoch {self.current_epoch}){above}")
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        self._epoch_loss[0] += loss.detach()
        self._epoch_loss[1] += 1
        return loss

    def training_loss(self, inputs, targets, state=None):
        """The training loss of one batch (mean cross-entropy; recall targets weighed), and the final state."""
        logits, state = self.model(inputs, state)
        if self.recall_weight == 1:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        else:
            losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
            weights = 1 + (self.recall_weight - 1) * (inputs.reshape(-1) == self.recall_cue)
            loss = (losses * weights).sum() / weights.sum()
        return loss, state

    def on_train_start(self) -> None:
        """cuda_graphs: the training step captured in a CUDA graph (models/cuda_graphs.py) on one CUDA device."""
        self.graphed_step = None
        if not cuda_graphs.enabled() or self.device.type != GRAPH_DEVICE:
            return
        if self.trainer.world_size > 1:  # DDP reduces gradients in backward hooks, outside any graph
            print(f"cuda_graphs: not used under DDP ({self.trainer.world_size} processes); training eagerly")
            return
        self.graphed_step = GraphedTrainingStep(self.training_loss, self.model.parameters())

    def backward(self, loss, *args, **kwargs) -> None:
        if self.graphed_step is None:  # a graphed step ran its own backward
            super().backward(loss, *args, **kwargs)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer) -> None:
        if self.graphed_step is None:  # a graphed step writes (not adds) its gradients, into the graph's memory
            super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    @property
    def divergence_limit(self) -> float:
        """DIVERGENCE_FACTOR times a uniform guess's ln V nats: every run starts near it; a far too large learning
        rate sends the loss orders of magnitude above it within a few steps (no false alarm)."""
        return DIVERGENCE_FACTOR * math.log(self.model.vocab_size)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        # Measured after the optimiser step, so tokens/s covers forward, backward and update.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - self._step_started
        tokens = batch[0].numel()
        self.train_tokens += tokens
        self.train_seconds += seconds
        self.log("train/tokens_per_second", tokens / max(seconds, 1e-9), prog_bar=True)

    def on_train_epoch_end(self) -> None:
        if self._epoch_loss[1]:
            self.log("train/epoch_loss", self.last_epoch_train_loss)

    @property
    def last_epoch_train_loss(self) -> float:
        """The mean training loss of the last epoch (so far), from the sums checkpoints carry; nan before a step."""
        loss_sum, count = self._epoch_loss
        return float(loss_sum) / count if count else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.train_tokens / self.train_seconds if self.train_seconds else float("nan")

    def configure_optimizers(self):
        optimizer = self.recipe.optimizer(self, self.hparams.lr)
        schedule = self.recipe.schedule(optimizer, self.trainer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": schedule.interval}}

    # --- validation: the whole split, accumulated over batches ------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_score = Score()

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        logits, _ = self.model(inputs)
        self._val_score = self._val_score.add(score_batch(logits, targets, self.token_char_lengths, self.plain_tokens))

    def on_validation_epoch_end(self) -> None:
        score = self._val_score
        if score.tokens == 0:
            return
        self.last_val_score, self.last_val_step = score, self.global_step
        # Every rank scores the same whole split, so the values agree across ranks.
        self.log("val/loss", score.nll, prog_bar=True)
        self.log("val/bpc", score.bpc, prog_bar=True)

    # --- checkpoints carry the tokenizer and the running training statistics ----------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = self.tokenizer.state_dict()
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"  # a counted model saves unfitted
        planned = self.trainer.estimated_stepping_batches if fitting else float("inf")
        # A run resumed mid-epoch reports the same epoch loss and throughput as an uninterrupted one.
        checkpoint["train_statistics"] = {
            "epoch_loss_sum": float(self._epoch_loss[0]), "epoch_loss_count": self._epoch_loss[1],
            "train_tokens": self.train_tokens, "train_seconds": self.train_seconds,
            # where this part stops: a resume must go beyond the step
            "planned_steps": int(planned) if math.isfinite(planned) else None,
        }
        if self.run_config is not None:  # what a resume falls back on where .hydra/config.yaml is lost or damaged
            checkpoint["run_config"] = self.run_config
        if self.corpus_sha256 is not None:  # a resume refuses another text (resume.ResumePoint.check_corpus)
            checkpoint["corpus_sha256"] = self.corpus_sha256
        if self.carried_state is not None:  # streams: every rank's carried state (ranks read their own streams)
            checkpoint["carried_state"] = self._gather_ranks(self.carried_state)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if stats := checkpoint.get("train_statistics"):
            self._epoch_loss = [stats["epoch_loss_sum"], stats["epoch_loss_count"]]
            self.train_tokens, self.train_seconds = stats["train_tokens"], stats["train_seconds"]
        if ranks := checkpoint.get("carried_state"):
            rank = self.trainer.global_rank if self._trainer is not None else 0
            self.carried_state = map_state(lambda t: t.to(self.device), ranks[rank])

    def _gather_ranks(self, state) -> list:
        """[the state of rank 0, of rank 1, ...]: on_save_checkpoint runs on every rank, only rank 0 writes."""
        world = self.trainer.world_size if self._trainer is not None else 1
        if world == 1:
            return [state]
        gathered = self.all_gather(state)  # each tensor gains a leading (world,) dimension
        return [map_state(lambda t, r=r: t[r], gathered) for r in range(world)]


def load_checkpoint(path, map_location="cpu") -> LanguageModelTask:
    """Model and tokenizer from a checkpoint alone (weights_only); a UserError for a missing or foreign file."""
    checkpoint = read_checkpoint(path, map_location=map_location)
    try:
        tokenizer = tokenizer_from_state(checkpoint["tokenizer"])
        task = LanguageModelTask(**checkpoint["hyper_parameters"], tokenizer=tokenizer, from_checkpoint=True)
        task.load_state_dict(checkpoint["state_dict"])
    except UserError as err:
        raise UserError(f"{path} is not a usable gru-experiments checkpoint: {err}") from None
    except (TypeError, KeyError, ValueError, RuntimeError) as err:
        raise UserError(f"{path} is not a usable gru-experiments checkpoint: {str(err).splitlines()[0]}") from None
    task.corpus_sha256 = checkpoint.get("corpus_sha256")  # what the weights trained on (trained_run.splits checks it)
    task.trained_steps = checkpoint.get("global_step")
    if tokenizer.vocab_size != task.model.vocab_size:
        raise UserError(f"{path} is inconsistent: its tokenizer has {tokenizer.vocab_size} symbols but its model "
                        f"{task.model.vocab_size}")
    return task.eval()
