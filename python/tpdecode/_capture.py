"""A call must not run outside a CUDA-graph capture that is underway in its process.

tpdecode launches on the current torch stream of the call's device (its tensors').
``torch.cuda.graph`` captures on its capture stream and makes that stream's device
current; without ``stream=``, it keeps one capture stream per process, made on the
device current at its first use. A process that first captured on cuda:0 (e.g.
before ``torch.cuda.set_device(local_rank)``) later captures on cuda:0 whatever
device its tensors are on: a call on cuda:1 then finds that device's current
stream not capturing, runs at once, and the graph has nothing of it (torch warns
"The CUDA Graph is empty"). On an NCCL team that is a wrong result, not an error:
the peers' graphs replay against this rank's one eager call. This module turns it
into an error before anything is launched."""


def capture_device_refusal(call_device: int, current_device: int, capturing_here: bool, capturing_there: bool,
                           what: str) -> str:
    """Why `what` on cuda:`call_device` must not run, "" where it may: a capture is
    underway on the current stream of cuda:`current_device` (capturing_here) while the
    call's device's current stream is not capturing (capturing_there)."""
    if call_device == current_device or not capturing_here or capturing_there:
        return ""
    return (
        f"{what}: a CUDA-graph capture is underway on cuda:{current_device}'s current stream, but this call runs "
        f"on cuda:{call_device}'s current stream, which is not capturing: it would run now, outside the graph. "
        f"Capture on a stream of cuda:{call_device} (torch.cuda.graph(g, stream=torch.cuda.Stream({call_device}))), "
        f"or call torch.cuda.set_device({call_device}) before the process's first torch.cuda.graph (without "
        f"stream=, torch.cuda.graph keeps one capture stream per process, on the device current at its first use)."
    )


_torch = None  # torch, imported at the first check (this module is imported without it too)
_current = None  # current_device_query(), bound at the first check


def current_device_query():
    """torch's C query of the current CUDA device, without torch.cuda.current_device()'s
    Python steps (its lazy initialisation is done once a CUDA tensor exists; a torch
    without CUDA has only the Python one). An eager call checks it every time, so a
    caller whose device is the call's skips the rest of the check inline."""
    import torch

    return getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def check_capture_device(call_device: int, what: str) -> None:
    """Raises RuntimeError where capture_device_refusal refuses. Costs one
    current-device query per call; the capture queries run only when the current
    device is not the call's."""
    global _torch, _current
    if _torch is None:
        import torch as _torch

        _current = current_device_query()
    torch = _torch
    current = _current()
    if current == call_device or not torch.cuda.is_current_stream_capturing():
        return
    with torch.cuda.device(call_device):
        there = torch.cuda.is_current_stream_capturing()
    why = capture_device_refusal(call_device, current, True, there, what)
    if why:
        raise RuntimeError(why)
