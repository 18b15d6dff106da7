"""Per-episode videos: ``rlmesh.run(..., record_video=K, video_dir=..., video_key=...)``.

The first K episode indices of a run are recorded to mp4 files (``recorder.py``: which
episodes, where the frames come from, the ``Lanes`` wrapper that takes them), encoded on a
background thread through a bounded queue (``encoder.py``, with ``imageio`` and
``imageio-ffmpeg``: the ``video`` extra). Each recorded ``EpisodeResult.video`` links its file,
relative to the results file's directory.
"""

from __future__ import annotations

from .encoder import PARTIAL_SUFFIX, QUEUE_FRAMES, VideoEncoder, VideoError
from .recorder import (
    DEFAULT_FPS,
    WHOLE_OBSERVATION,
    NoVideos,
    RecordingLanes,
    VideoRecorder,
    video_name,
)

__all__ = [
    "DEFAULT_FPS",
    "PARTIAL_SUFFIX",
    "QUEUE_FRAMES",
    "WHOLE_OBSERVATION",
    "NoVideos",
    "RecordingLanes",
    "VideoEncoder",
    "VideoError",
    "VideoRecorder",
    "video_name",
]
