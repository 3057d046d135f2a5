"""remat in a transformers.Trainer job: a tiny Llama wrapped by remat.wrap_decoder_layers (with a
budget: remat.fit), trained by Trainer with gradient accumulation, clipping, Trainer's own
gradient_checkpointing=True (which turns checkpointing on as training begins, after the wrap) and
accelerate's optimizer wrapper around AdamW. Losses and final parameters bitwise the same job's
without remat; remat's checkpoints ran and the steps were planned."""

import os
import warnings

import pytest
import torch

import remat

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (scripts/install-deps.sh installs it from PyPI)")
pytest.importorskip("accelerate", reason="accelerate is not installed (scripts/install-deps.sh installs it from PyPI)")

SEQUENCE = 64


class Batches(torch.utils.data.Dataset):
    def __init__(self, count=16):
        self.ids = torch.randint(0, 256, (count, SEQUENCE), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def trained(tmp_path, wrap, **options):
    """(losses, final parameters, the model) of 4 optimizer steps of Trainer on a fresh tiny Llama,
    wrap(model) applied first."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, vocab_size=256, use_cache=False)
    model = wrap(transformers.LlamaForCausalLM(config))
    arguments = transformers.TrainingArguments(
        output_dir=os.fspath(tmp_path), max_steps=4, per_device_train_batch_size=2, report_to=[], use_cpu=True,
        save_strategy="no", logging_steps=1, seed=42, data_seed=42, disable_tqdm=True, **options)
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=Batches())
    with remat.tag_cpu_tensors(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}, model


@pytest.mark.parametrize("options", [{"gradient_accumulation_steps": 2},
                                     {"gradient_accumulation_steps": 2, "gradient_checkpointing": True,
                                      "max_grad_norm": 0.5}],
                         ids=["accumulation", "accumulation-trainer-checkpointing-clipping"])
def test_trainer_with_a_budget_trains_as_without_remat(tmp_path, options):
    # Predicting the first optimizer step of an accumulation cycle wrote meta stand-ins into the
    # AdamW that accelerate's wrapper steps: no parameter changed again, with no error
    losses, parameters, _ = trained(tmp_path / "plain", lambda model: model, **options)
    with remat.collect_trace() as trace:
        fitted_losses, fitted_parameters, model = trained(
            tmp_path / "fitted", lambda model: remat.wrap_decoder_layers(model, budget="64MiB"), **options)
    assert fitted_losses == losses and len(losses) == 4
    assert all(torch.equal(fitted_parameters[name], p) for name, p in parameters.items())
    state = model.remat_fit
    assert state.cycle == 2 and state.profiled_steps == 1 and state.planned_steps == 7
    assert {s.name for s in trace.scopes} >= {"model.layers.0", "model.layers.1"}  # remat's checkpoints ran


def test_trainer_checkpointing_on_a_wrapped_model_keeps_remat(tmp_path):
    losses, parameters, _ = trained(tmp_path / "plain", lambda model: model, gradient_checkpointing=True)
    with remat.collect_trace() as trace:
        wrapped_losses, wrapped_parameters, _ = trained(tmp_path / "wrapped", remat.wrap_decoder_layers,
                                                        gradient_checkpointing=True)
    assert wrapped_losses == losses
    assert all(torch.equal(wrapped_parameters[name], p) for name, p in parameters.items())
    assert {s.name for s in trace.scopes} >= {"model.layers.0", "model.layers.1"}
