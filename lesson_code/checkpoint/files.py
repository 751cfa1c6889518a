"""The files of a sharded checkpoint (lesson 80): atomic writes, the manifest, hashes.

One process, no process group: `checkpoint` builds its collective save and load on these. A file
is written under a temporary name, fsynced, renamed, and its folder fsynced, so after a crash it
is either absent or complete. `manifest.json` lists every file with its size and sha256, and
`manifest.sha256` holds the sha256 of the manifest's own bytes in the format of `sha256sum`, so
`sha256sum -c manifest.sha256` checks it from a shell too. A checksum catches damage (a torn
write, a flipped bit, an edit by hand), not a forger, who can rewrite both files.

    write_manifest(folder, manifest)       # manifest.json + manifest.sha256, both fsynced
    manifest = verify_checkpoint(folder)   # every file's size and sha256, or a CheckpointError
    verify_checkpoint(folder, hashes=False)  # the manifest and every file's size: no file read
"""

from __future__ import annotations

import fcntl  # F_FULLFSYNC on macOS
import hashlib
import io
import json
import os
import platform
import re
from pathlib import Path

import torch

from lesson_code import language

FORMAT_VERSION = 2  # 2: the manifest's sha256 in manifest.sha256 (1 kept it inside)
MANIFEST = "manifest.json"
MANIFEST_SHA256 = "manifest.sha256"
# The names a checkpoint folder of step N has: step-N, published, or .step-N.tmp / .step-N.replaced,
# hidden (staging.step_folder, staging_folder, aside_folder); the name's step must be the manifest's.
NAMED_STEP = re.compile(r"^\.?step-(\d{8})(?:\.tmp|\.replaced)?$")


class CheckpointError(Exception):
    """Base of every error a checkpoint can raise; each names the file and what is wrong.

    Its message is English, as Python's are; the error also keeps the facts it states: `path`,
    the file or folder at fault, `fault`, what is wrong (a key of FAULTS), and `facts`, the
    numbers and names of the message. `explain("fa")` says the same in Persian from these
    (lesson 80's Persian edition prints it beside the error's name); `explain("en")` is the
    message."""

    def __init__(self, message: str = "", *, path: Path | str | None = None,
                 fault: str | None = None, **facts):
        super().__init__(message)
        self.path = None if path is None else str(path)
        self.fault = fault
        self.facts = facts

    def explain(self, lang: str = "fa") -> str:
        """What is wrong, in `lang`: the message in English; in Persian the sentence FAULTS
        holds for `fault`, with the path left to right and numbers by `language.number` (the
        message itself where the error has no known fault)."""
        if language.check_language(lang) == "en" or self.fault not in FAULTS:
            return str(self)
        facts = {key: _fact_fa(key, value) for key, value in self.facts.items()}
        sentence = language.fill(FAULTS[self.fault], "fa", path=language.isolated(self.path),
                                 **facts)
        found_by = self.facts.get("found_by")
        if found_by:
            sentence += language.fill(" (رتبه‌های {ranks} آن را یافتند)"
                                      if len(found_by) > 1 else " (یافتهٔ رتبهٔ {ranks})",
                                      "fa", ranks=language.series(
                                          [language.number(r, "fa") for r in found_by], "fa"))
        return sentence


def _fact_fa(key: str, value):
    """One fact as a Persian sentence quotes it: «هیچ‌کدام» for an empty list; a list of reasons
    (each with its own `explain`) in Persian, joined by «؛»; a list of names, each left to right,
    joined by «، » as a Persian list; a Latin name left to right; anything else as it is."""
    if isinstance(value, (list, tuple)):
        if not value:
            return "هیچ‌کدام"
        if all(hasattr(item, "explain") for item in value):
            return "؛ ".join(item.explain("fa") for item in value)
        return language.listed([language.isolated(str(item)) for item in value], "fa")
    return language.isolated(value) if key in ISOLATED_FACTS else value


class ManifestMissingError(CheckpointError):
    """No manifest.json: the folder is not a complete checkpoint (perhaps an interrupted save)."""


class ManifestDamagedError(CheckpointError):
    """manifest.json's bytes do not match manifest.sha256 (a torn write, a flipped bit, an edit)."""


class FormatVersionError(CheckpointError):
    """The manifest's format version is one this code does not read."""


class WorldSizeMismatchError(CheckpointError):
    """The checkpoint was saved by another number of ranks."""


class ShardMissingError(CheckpointError):
    """A file the manifest lists is not there."""


class ShardCorruptedError(CheckpointError):
    """A file's size or sha256 differs from the manifest's (truncated, or bytes changed)."""


class FolderNotSharedError(CheckpointError):
    """The ranks do not all see the same checkpoint folder (no shared filesystem)."""


SHARED_FOLDER_FA = ("همهٔ رتبه‌ها باید یک پوشه را ببینند: یک سامانهٔ فایل مشترک (NFS، Lustre، ...) "
                    "به کار ببرید که روی هر گره در همان مسیر سوار شده باشد")
# What each fault of a CheckpointError says in Persian (CheckpointError.explain); {path} is the
# error's path, the other fields its facts.
FAULTS = {
    "manifest_missing": "{path} وجود ندارد: {folder} چکپوینت کاملی نیست (ذخیره‌ای که نیمه‌کاره "
                        "ماند هرگز آن را نمی‌نویسد)؛ گامی پیش‌تر را بارگذاری کنید، "
                        "`latest_checkpoint()` را ببینید",
    "checksum_unreadable": "{checksum} نیست یا چکیدهٔ `sha256` خوانایی در آن نیست، پس {path} را "
                           "نمی‌توان وارسی کرد: هر دو را از یک رونوشت برگردانید، یا چکپوینتی "
                           "پیش‌تر را بارگذاری کنید",
    "manifest_changed": "{path} آسیب دیده است: چکیدهٔ `sha256` آن {digest} است ولی {checksum} "
                        "چکیدهٔ {recorded} را ثبت کرده است؛ این فایل پس از ذخیره بریده، وارونه یا "
                        "ویرایش شده است. آن را از یک رونوشت برگردانید، یا چکپوینتی پیش‌تر را "
                        "بارگذاری کنید",
    "not_json": "{path} با چکیده‌اش جور است ولی JSON نیست: این کد آن را ننوشته است؛ چکپوینت "
                "دیگری را بارگذاری کنید",
    "step_mismatch": "{path} گام {step} را ثبت کرده است ولی نام پوشه‌اش، {folder}، گام {named} را "
                     "می‌گوید: پوشه با دست رونوشت یا تغییرنام داده شده است؛ نامش را به {expected} "
                     "برگردانید، یا چکپوینت دیگری را بارگذاری کنید",
    "format_version": "قالب {path} نسخهٔ {version} است ولی این کد نسخهٔ {expected} را می‌خواند: آن "
                      "را با همان نسخه‌ای از `lesson_code` بارگذاری کنید که نوشته‌اش",
    "shard_missing": "{path} در مانیفست آمده ولی وجود ندارد: چکپوینت ناقص است؛ فایل را برگردانید "
                     "یا چکپوینت دیگری را بارگذاری کنید",
    "shard_size": "{path} {size} بایت است ولی مانیفست {expected} بایت ثبت کرده است: فایل بریده یا "
                  "بازنویسی شده است",
    "shard_changed": "چکیدهٔ `sha256` فایل {path} برابر {digest} است ولی مانیفست {recorded} را ثبت "
                     "کرده است: بایت‌هایش پس از ذخیره تغییر کرده‌اند",
    "world_size": "{path} را {saved} رتبه ذخیره کرده‌اند ولی `world_size` برابر {world_size} است: "
                  "نخست آن را بازشاردبندی کنید، مثلاً با `{call}`",
    "staging_not_seen": "رتبهٔ ۰ پوشهٔ {path} را برای این ذخیره ساخت ولی رتبهٔ {rank} آن را "
                        "نمی‌بیند: " + SHARED_FOLDER_FA,
    "different_views": "رتبه‌ها در {path} چکپوینت یکسانی نمی‌بینند: " + SHARED_FOLDER_FA,
    "locked": "قفل {path} پس از {timeout_s:.0f} ثانیه هنوز در دست دیگری است: اگر آن فرایند از "
              "اجرای دیگری است، به هر اجرا پوشهٔ خودش را بدهید؛ اگر خوانندگان این پوشه‌اند، "
              "بگذارید کارشان تمام شود و دوباره ذخیره کنید",
    "none_loads": "در {path} هیچ چکپوینتی بارگذاری نمی‌شود (بارگذاری ناکام: {failed}؛ "
                  "کنارگذاشته: {skipped})؛ آغازی از نو چکپوینت‌های تازه را روی آن‌ها می‌نوشت: "
                  "یکی را بازیابی کنید، یا برای آغازی از نو آن‌ها را به جای دیگری ببرید",
    "io": "کار روی {path} ناکام ماند ({reason}): دیسک (فضا، دسترسی‌ها) را وارسی کنید و اینکه همهٔ "
          "رتبه‌ها پوشهٔ آن را می‌بینند",
}
ISOLATED_FACTS = ("folder", "checksum", "digest", "recorded", "reason", "expected")  # Latin, left to right


class Disk:
    """What a save does to the disk: durable writes, renames and fsyncs, in one small object.

    Every save and publish takes one (`disk=`, default `DISK`, the real calls), so a lesson or a
    test that wants a crash or a trace at one of these points passes a subclass that overrides
    that method (see `checkpoint.faults`); the save code and the os module stay as they are.
    """

    def replace(self, source: Path, destination: Path) -> None:
        """Rename `source` to `destination` (atomic on POSIX within one filesystem)."""
        os.replace(source, destination)

    def fsync(self, handle: int) -> None:
        """Flush the open file or folder `handle` through to the storage device.

        On Linux `os.fsync` returns once the device has the data durably, its write cache
        flushed. On macOS `fsync` only hands the data to the drive, whose cache a power cut can
        still lose; `fcntl(F_FULLFSYNC)` makes the drive flush it. So F_FULLFSYNC is used wherever
        fcntl has it, and fsync where that call fails (a filesystem that does not support it).
        Either way the guarantee is only as good as the drive's or the file server's promise.
        """
        if hasattr(fcntl, "F_FULLFSYNC"):
            try:
                fcntl.fcntl(handle, fcntl.F_FULLFSYNC)
                return
            except OSError:
                pass  # not supported here: fsync is the most this filesystem offers
        os.fsync(handle)

    def write_atomically(self, path: Path, payload: bytes) -> None:
        """Write `payload` to `path` so that `path` is either absent or complete, never half-written;
        once this returns, the file and its name survive a power cut (see `fsync` for macOS). On
        NFS the server commits a rename before it answers, unless the folder is exported `async`.
        """
        temporary = partial_path(path)
        with open(temporary, "wb") as handle:
            handle.write(payload)
            handle.flush()
            self.fsync(handle.fileno())
        self.replace(temporary, path)
        self.fsync_directory(path.parent)

    def fsync_directory(self, folder: Path) -> None:
        """Make a rename or creation inside `folder` durable (POSIX; a no-op where it cannot)."""
        try:
            handle = os.open(folder, os.O_RDONLY)
        except OSError:
            return
        try:
            self.fsync(handle)
        finally:
            os.close(handle)


DISK = Disk()  # the real disk: what every save uses unless it is given another


def partial_path(path: Path) -> Path:
    """The temporary name `path` is written under before its rename: .name.<pid>.partial."""
    return path.with_name(f".{path.name}.{os.getpid()}.partial")


def write_file(folder: Path, name: str, tensors: dict[str, torch.Tensor],
               disk: Disk = DISK) -> dict:
    """Serialise `tensors` to folder/name atomically on `disk`; return its manifest entry."""
    buffer = io.BytesIO()
    torch.save({key: value.detach().cpu().contiguous() for key, value in tensors.items()}, buffer)
    payload = buffer.getvalue()
    disk.write_atomically(folder / name, payload)
    return {"name": name, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
            "tensors": {key: {"dtype": str(value.dtype).removeprefix("torch."),
                              "shape": list(value.shape)} for key, value in tensors.items()}}


def write_manifest(folder: Path, manifest: dict, disk: Disk = DISK) -> None:
    """Write manifest.json, then manifest.sha256 with the sha256 of exactly those bytes.

    JSON turns dict keys into strings and tuples into lists: an `extra` of {1: "a"} reads back
    as {"1": "a"}. Raises TypeError naming the value JSON cannot store (a tensor, a set).
    """
    try:
        payload = (json.dumps(manifest, indent=2) + "\n").encode()
    except (TypeError, ValueError) as error:
        raise TypeError(f"the manifest of {folder} cannot be written as JSON ({error}): keep "
                        "`extra` to str, int, float, bool, None, lists and dicts") from error
    disk.write_atomically(folder / MANIFEST, payload)
    digest = hashlib.sha256(payload).hexdigest()
    disk.write_atomically(folder / MANIFEST_SHA256, f"{digest}  {MANIFEST}\n".encode())


def read_manifest(folder: Path | str) -> dict:
    """The manifest of the checkpoint in `folder`, after checking its sha256, its version, and
    that the step it records is the step the folder's name says (for a folder named as a save
    names it, step-N or .step-N.tmp / .replaced: a copy renamed by hand would otherwise resume
    from the wrong step).

    Raises ManifestMissingError, ManifestDamagedError or FormatVersionError, naming the file.
    """
    path = Path(folder) / MANIFEST
    try:
        payload = path.read_bytes()
    except FileNotFoundError:
        raise ManifestMissingError(
            f"{path} does not exist: {Path(folder).name} is not a complete checkpoint (a save that "
            "was interrupted never writes it); load an earlier step, see latest_checkpoint()",
            path=path, fault="manifest_missing", folder=Path(folder).name) from None
    try:
        recorded = (Path(folder) / MANIFEST_SHA256).read_text(encoding="ascii").split()[0]
    except (FileNotFoundError, IndexError, UnicodeDecodeError):
        _refuse_another_version(path, payload)
        raise ManifestDamagedError(
            f"{Path(folder) / MANIFEST_SHA256} is missing or holds no readable sha256, so {path} "
            "cannot be checked: restore both from a copy, or load an earlier checkpoint",
            path=path, fault="checksum_unreadable", checksum=str(Path(folder) / MANIFEST_SHA256)
        ) from None
    digest = hashlib.sha256(payload).hexdigest()
    if digest != recorded:
        raise ManifestDamagedError(
            f"{path} is damaged: its sha256 is {digest[:16]}... but {MANIFEST_SHA256} records "
            f"{recorded[:16]}...; the file was cut short, flipped or edited since the save. "
            "Restore it from a copy, or load an earlier checkpoint", path=path,
            fault="manifest_changed", digest=digest[:16] + "...", recorded=recorded[:16] + "...",
            checksum=MANIFEST_SHA256)
    try:
        manifest = json.loads(payload)
    except ValueError as error:
        raise ManifestDamagedError(f"{path} matches its sha256 but is not JSON ({error}): it was "
                                   "not written by this code; load another checkpoint",
                                   path=path, fault="not_json") from None
    _refuse_another_version(path, payload)
    named = NAMED_STEP.match(Path(folder).name)
    if named and int(named.group(1)) != manifest.get("step"):
        expected = f"step-{manifest.get('step'):08d}" if isinstance(manifest.get("step"), int) \
            else "its step's name"
        raise ManifestDamagedError(
            f"{path} records step {manifest.get('step')!r}, but its folder's name, "
            f"{Path(folder).name}, says step {int(named.group(1))}: the folder was copied or "
            f"renamed by hand; rename it to {expected}, or load another checkpoint", path=path,
            fault="step_mismatch", step=manifest.get("step"), named=int(named.group(1)),
            folder=Path(folder).name, expected=expected)
    return manifest


def _refuse_another_version(path: Path, payload: bytes) -> None:
    """Raise FormatVersionError when `payload` parses as a manifest of another format version.

    Checked before the checksum file is required too: a version 1 checkpoint has none (its
    checksum sat inside the manifest), and should be told so rather than called damaged.
    """
    try:
        version = json.loads(payload).get("format_version")
    except (ValueError, AttributeError):
        return
    if version != FORMAT_VERSION:
        raise FormatVersionError(
            f"{path} has format version {version!r}; this code reads version {FORMAT_VERSION}: "
            "load it with the lesson_code version that wrote it", path=path,
            fault="format_version", version=version, expected=FORMAT_VERSION)


def check_entry(folder: Path, entry: dict, payload: bytes | None = None, *,
                hashes: bool = True) -> None:
    """Raise unless folder/entry["name"] exists with the manifest's size and sha256.

    Reads the file unless its bytes are given; without `hashes`, checks only that the file
    exists with the manifest's size (a stat, no read: a changed byte goes unnoticed). Raises
    ShardMissingError or ShardCorruptedError.
    """
    path = Path(folder) / entry["name"]
    if payload is None and hashes:
        payload = _bytes_or_none(path)
    size = len(payload) if payload is not None else _size_or_none(path)
    if size is None:
        raise ShardMissingError(f"{path} is listed in the manifest but missing: the checkpoint is "
                                "incomplete; restore the file or load another checkpoint",
                                path=path, fault="shard_missing")
    if size != entry["bytes"]:
        raise ShardCorruptedError(f"{path} is {size} bytes but the manifest says "
                                  f"{entry['bytes']}: the file was truncated or overwritten",
                                  path=path, fault="shard_size", size=size,
                                  expected=entry["bytes"])
    if payload is None:
        return  # sizes only
    digest = hashlib.sha256(payload).hexdigest()
    if digest != entry["sha256"]:
        raise ShardCorruptedError(f"{path} has sha256 {digest[:16]}..., the manifest "
                                  f"{entry['sha256'][:16]}...: its bytes changed since the save",
                                  path=path, fault="shard_changed", digest=digest[:16] + "...",
                                  recorded=entry["sha256"][:16] + "...")


def _bytes_or_none(path: Path) -> bytes | None:
    """The bytes of `path`, or None when there is no such file."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _size_or_none(path: Path) -> int | None:
    """The size of `path` in bytes, or None when there is no such file."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def read_verified(folder: Path, entry: dict) -> dict[str, torch.Tensor]:
    """Load one file after checking it exists and that its size and sha256 match the manifest."""
    payload = _bytes_or_none(Path(folder) / entry["name"])
    check_entry(folder, entry, payload)
    return torch.load(io.BytesIO(payload), weights_only=True)


def verify_checkpoint(folder: Path | str, *, hashes: bool = True) -> dict:
    """Check the manifest and every file it lists (size and sha256); return the manifest.

    One process reads every byte of the checkpoint. With `hashes=False` it reads only the
    manifest (checked against manifest.sha256) and compares every file's size: a stat per file
    instead of a read, which catches a missing or truncated file but not a changed byte, left to
    the load's own hashing. Raises the CheckpointError of the first problem found, naming the file.
    """
    manifest = read_manifest(folder)
    for entry in manifest["files"]:
        check_entry(Path(folder), entry, hashes=hashes)
    return manifest


def manifest_fingerprint(folder: Path | str) -> str | None:
    """sha256 of folder/manifest.json as this process sees it, None if it sees no such file.

    Ranks compare fingerprints to learn whether they all see the same checkpoint. Any other
    OSError (a permission denied, an I/O error) is raised as it is, naming the file: the file may
    well be there.
    """
    try:
        return hashlib.sha256((Path(folder) / MANIFEST).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def versions() -> dict[str, str]:
    """Versions of the libraries that wrote a checkpoint (recorded in its manifest)."""
    from lesson_code import __version__
    return {"torch": torch.__version__, "python": platform.python_version(),
            "lesson_code": __version__}
