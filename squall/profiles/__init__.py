"""Network profiles: YAML -> frozen dataclasses, units parsed, every combination validated.

Typical use::

    profile = load_profile("wan-50ms-100mbit")
    profile.validate_for(8)
    spec = profile.link(0, 1, n=8)             # LinkSpec for the directed link 0 -> 1
    events = profile.churn_events(8, duration=600.0)
    device = profile.device(3, n=8)

The schema is documented in ``netem_profiles/README.md``. Layer rule: this package imports only the
standard library and yaml.
"""

from __future__ import annotations

from squall.profiles.errors import ProfileError
from squall.profiles.loader import (
    PATH_ENV,
    PROFILE_DIR,
    ProfileInfo,
    find_profile,
    list_profiles,
    load_profile,
    parse_profile,
    profile_dirs,
    profile_from_data,
)
from squall.profiles.model import (
    Chance,
    ChurnEvent,
    ChurnKind,
    DeviceSpec,
    Distribution,
    GilbertElliott,
    Jitter,
    LinkSpec,
    Loss,
    NodeLinkSpec,
)
from squall.profiles.profile import Phase, Profile

NetworkProfile = Profile  # an older name, kept for users' code

__all__ = [
    "PATH_ENV",
    "PROFILE_DIR",
    "Chance",
    "ChurnEvent",
    "ChurnKind",
    "DeviceSpec",
    "Distribution",
    "GilbertElliott",
    "Jitter",
    "LinkSpec",
    "Loss",
    "NetworkProfile",
    "NodeLinkSpec",
    "Phase",
    "Profile",
    "ProfileError",
    "ProfileInfo",
    "find_profile",
    "list_profiles",
    "load_profile",
    "parse_profile",
    "profile_dirs",
    "profile_from_data",
]
