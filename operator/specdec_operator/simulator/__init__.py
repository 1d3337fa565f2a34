"""An SGLang-compatible simulator: a continuous-batching performance model behind SGLang 0.5.23's HTTP API.

For tests, the demo and anyone without GPUs. ``SimulatorServer`` runs one in-process; ``specdec simulate``
runs one as a process, and ``SimulatorProcess`` runs that as a child. Profiles describe the simulated server
(see docs/probe.md).
"""

from .adaptive import AdaptiveConfig, adaptive_config_from_dict, load_adaptive_config
from .faults import ErrorConfig
from .model import Engine, Profile, SpeculativeConfig, load_profile, profile_from_dict, shipped_profiles
from .process import SimulatorProcess
from .server import Simulator, SimulatorServer

__all__ = [
    "AdaptiveConfig",
    "Engine",
    "ErrorConfig",
    "Profile",
    "Simulator",
    "SimulatorProcess",
    "SimulatorServer",
    "SpeculativeConfig",
    "adaptive_config_from_dict",
    "load_adaptive_config",
    "load_profile",
    "profile_from_dict",
    "shipped_profiles",
]
