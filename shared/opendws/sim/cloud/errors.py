"""The errors the simulated APIs answer with."""

from __future__ import annotations


class CloudError(Exception):
    """An error the API answers with: an HTTP status, a Compute-style ``reason`` (``notFound``,
    ``alreadyExists``, ``invalid``, ``resourceNotReady``, ``resourceInUseByAnotherResource``,
    ``failedPrecondition``) and a message naming the resource."""

    def __init__(self, http_status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.reason = reason
        self.message = message

    @classmethod
    def not_found(cls, resource: str) -> CloudError:
        return cls(404, "notFound", f"The resource '{resource}' was not found")

    @classmethod
    def already_exists(cls, resource: str) -> CloudError:
        return cls(409, "alreadyExists", f"The resource '{resource}' already exists")

    @classmethod
    def invalid(cls, message: str) -> CloudError:
        return cls(400, "invalid", message)

    @classmethod
    def not_ready(cls, message: str) -> CloudError:
        return cls(400, "resourceNotReady", message)
