"""The Hugging Face Trainer callback and the Lightning logger: tiny models trained on the CPU log their
curves, config and finish status into a real `gpuwatch serve`.

They need torch, transformers (with accelerate) and lightning; without them the tests skip, except in
CI (REQUIRE_TEST_TOOLS=1, where .ci/run installs them), where they fail.
"""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import Server, clean_env, free_port, wait_until

pytestmark = [
    pytest.mark.slow,
    # The libraries' own warnings about each other's versions and about tiny data loaders.
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def require_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("REQUIRE_TEST_TOOLS") == "1":
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("integrations") / "data"
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_DEMO_SOURCES="false", HF_HUB_OFFLINE="1")
    srv = Server(["--demo"], data_dir, free_port(), env).start()
    yield srv
    srv.stop(signal.SIGKILL)


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, server: Server) -> None:
    """No downloads, no other experiment trackers; the SDK finds gpuwatch through GPUWATCH_URL."""
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_DISABLED": "true",
        "GPUWATCH_URL": server.url,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GPUWATCH_RUN", raising=False)


def run_info(server: Server, run: str) -> dict[str, Any] | None:
    found = [r for r in server.get("/api/v1/runs").json()["data"] if r["run"] == run]
    return found[0] if found else None


def curve(server: Server, run: str, metric: str) -> list[tuple[float, float]]:
    """Return (step, value) of `metric` for `run`, joining its samples with training_step's by time."""

    def series(name: str) -> dict[float, float]:
        resp = server.get("/api/v1/query", params={"query": f'{name}{{run="{run}"}}[1h]'})
        assert resp.status_code == 200, resp.text
        result = resp.json()["data"]["result"]
        return {float(t): float(v) for r in result for t, v in r["values"]}

    steps, values = series("training_step"), series(metric)
    return sorted((steps[t], v) for t, v in values.items())


def finished(server: Server, run: str, status: str) -> None:
    wait_until(lambda: (run_info(server, run) or {}).get("status") == status, 30, f"{run} is not {status}")


def test_hf_trainer_logs_curves_config_checkpoints_and_finish(server: Server, tmp_path: Path) -> None:
    torch = require_module("torch")
    transformers = require_module("transformers")
    require_module("accelerate")
    from gpuwatch.integrations.hf import GpuwatchCallback

    torch.manual_seed(0)

    class Tiny(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
            out = self.lin(x).squeeze(-1)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    data = [{"x": torch.randn(4), "labels": torch.tensor(1.0)} for _ in range(32)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        run_name="hf-tiny",
        max_steps=8,
        per_device_train_batch_size=4,
        learning_rate=0.01,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=4,
        save_steps=4,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = GpuwatchCallback(flush_interval_s=0.1)
    trainer = transformers.Trainer(
        model=Tiny(), args=args, train_dataset=data, eval_dataset=data[:8], callbacks=[callback]
    )
    trainer.train()

    finished(server, "hf-tiny", "ok")
    info = run_info(server, "hf-tiny")
    assert info is not None
    assert info["total_steps"] == 8 and info["last_step"] == 8 and info["progress"] == 1.0
    assert info["config"]["learning_rate"] == 0.01 and info["config"]["max_steps"] == 8
    assert info["process"]["pid"] == os.getpid()
    loss = curve(server, "hf-tiny", "training_loss")
    assert [s for s, _ in loss] == [2, 4, 6, 8] and all(v >= 0 for _, v in loss)
    assert [s for s, _ in curve(server, "hf-tiny", "training_learning_rate")] == [2, 4, 6, 8]
    assert [s for s, _ in curve(server, "hf-tiny", "training_eval_loss")] == [4, 8]
    saves = curve(server, "hf-tiny", "training_checkpoint_seconds")
    assert [s for s, _ in saves] == [4, 8] and all(0 <= v < 60 for _, v in saves)


def _lightning_module(L: Any, torch: Any, fail_at: int | None = None) -> Any:
    class Regression(L.LightningModule):  # type: ignore[misc]
        def __init__(self, lr: float = 0.05, hidden: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
            )

        def training_step(self, batch: Any, index: int) -> Any:
            if fail_at is not None and self.global_step >= fail_at:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, index: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Regression()


def _lightning_fit(L: Any, torch: Any, run: str | None, fail_at: int | None = None) -> None:
    from gpuwatch.integrations.lightning import GpuwatchLogger

    torch.manual_seed(0)
    x = torch.randn(32, 4)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1))
    trainer = L.Trainer(
        max_steps=8,
        logger=GpuwatchLogger(run, total_steps=8, flush_interval_s=0.1),
        log_every_n_steps=2,
        val_check_interval=4,
        limit_val_batches=2,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer.fit(_lightning_module(L, torch, fail_at), loader, torch.utils.data.DataLoader(data, batch_size=4))


def test_lightning_logger_logs_curves_hyperparams_and_finish(server: Server) -> None:
    torch = require_module("torch")
    L = require_module("lightning")

    _lightning_fit(L, torch, "pl-tiny")
    finished(server, "pl-tiny", "ok")
    info = run_info(server, "pl-tiny")
    assert info is not None and info["total_steps"] == 8
    assert info["config"] == {"lr": 0.05, "hidden": 8}
    loss = curve(server, "pl-tiny", "training_train_loss")
    assert [s for s, _ in loss] == [1, 3, 5, 7]  # Lightning logs every 2nd step, from 0
    assert len(curve(server, "pl-tiny", "training_val_loss")) == 2

    with pytest.raises(RuntimeError, match="illegal memory access"):
        _lightning_fit(L, torch, "pl-crash", fail_at=3)
    finished(server, "pl-crash", "failed")


def test_an_integration_logs_into_the_run_the_script_started(server: Server) -> None:
    torch = require_module("torch")
    L = require_module("lightning")
    import gpuwatch.client as gw

    gw.init(run="pl-own", config={"dataset": "tiny"}, flush_interval_s=0.1)
    _lightning_fit(L, torch, None)
    assert gw.run is not None and gw.run.name == "pl-own" and not gw.run.is_finished
    gw.log({"custom": 1.0})
    assert gw.finish(timeout_s=30)
    finished(server, "pl-own", "ok")
    info = run_info(server, "pl-own")
    assert info is not None and info["config"] == {"dataset": "tiny", "lr": 0.05, "hidden": 8}
    assert len(curve(server, "pl-own", "training_train_loss")) == 4 and curve(
        server, "pl-own", "training_custom"
    )
