"""Per-episode videos: ``rlmesh.run(..., record_video=K, video_dir=..., video_key=...)``.

The first K episode indices of a run are recorded to mp4 files (``recorder.py``: which
episodes, where the frames come from, the ``Lanes`` wrapper that takes them), encoded on a
background thread fed frames in batches through a queue bounded in bytes, by an ``ffmpeg``
at a lower priority than the run (``encoder.py``; the binary ``imageio-ffmpeg`` ships: the
``video`` extra). Each recorded ``EpisodeResult.video`` links its file, relative to the
results file's directory.
"""

from __future__ import annotations

from .encoder import BATCH_BYTES, PARTIAL_SUFFIX, QUEUE_BYTES, VideoEncoder, VideoError
from .recorder import (
    DEFAULT_FPS,
    WHOLE_OBSERVATION,
    NoVideos,
    RecordingLanes,
    VideoRecorder,
    video_name,
)

__all__ = [
    "BATCH_BYTES",
    "DEFAULT_FPS",
    "PARTIAL_SUFFIX",
    "QUEUE_BYTES",
    "WHOLE_OBSERVATION",
    "NoVideos",
    "RecordingLanes",
    "VideoEncoder",
    "VideoError",
    "VideoRecorder",
    "video_name",
]
