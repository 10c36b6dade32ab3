"""Training-library integrations that log to gpuwatch through the SDK (`gpuwatch.client`).

- `gpuwatch.integrations.hf.GpuwatchCallback`: a Hugging Face `Trainer` callback.
- `gpuwatch.integrations.lightning.GpuwatchLogger`: a Lightning logger.

Each module imports its library at the top, so import only the one whose library is installed:
neither library is a dependency of gpuwatch. They sit at the end of the SDK's side of the flow: they
import `gpuwatch.client` only, and nothing in gpuwatch imports them.
"""
