"""The errors the simulated APIs answer with."""

from __future__ import annotations


class CloudError(Exception):
    """An error the API answers with: an HTTP status, a Compute-style ``reason`` (``notFound``,
    ``alreadyExists``, ``invalid``, ``resourceNotReady``, ``resourceInUseByAnotherResource``,
    ``failedPrecondition``, ``rateLimitExceeded``) and a message naming the resource;
    ``domain`` is the error's ``errors[].domain`` (``global``, or ``usageLimits`` for a
    quota)."""

    def __init__(
        self, http_status: int, reason: str, message: str, *, domain: str = "global"
    ) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.reason = reason
        self.message = message
        self.domain = domain

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

    @classmethod
    def resource_not_ready(cls, resource: str) -> CloudError:
        """A mutation of (or with) a resource whose own operation is still running."""
        return cls.not_ready(f"The resource '{resource}' is not ready")

    @classmethod
    def rate_limited(cls, message: str) -> CloudError:
        """A call over a rate quota: 403 ``rateLimitExceeded`` in ``usageLimits``
        (``quotas``)."""
        return cls(403, "rateLimitExceeded", message, domain="usageLimits")
