"""Where the platform may connect on an agent's behalf, and the connections themselves.

Agent URLs are team-supplied, so every connection to one is an SSRF surface. The policy
(ORS_EVAL_AGENT_ALLOWED_HOSTS, or "public addresses only" without it) is applied to the address a
socket is actually opened to: the network backends below resolve the host once, judge every address
it resolves to, and connect to those exact addresses. A DNS answer that changes between a check and a
connection (rebinding) therefore cannot lead anywhere the policy refuses. TLS still verifies the
certificate against the hostname (httpcore passes it as the server name after `connect_tcp`), and the
Host header is the URL's.

Every read and write on these connections is also clamped to the deadline of the call in progress
(`deadline()`), so a server that trickles a byte at a time cannot hold a thread past it.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import anyio
import httpcore
import httpx
from httpcore import AsyncNetworkBackend, AsyncNetworkStream, NetworkBackend, NetworkStream

log = logging.getLogger("orsplatform.evals")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# host, port -> the addresses (as strings) a connection to host:port may use, in preference order.
Resolver = Callable[[str, int], list[str]]
DEFAULT_PORTS = frozenset({80, 443})

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
# Special-purpose space that this Python's is_global does not (all) exclude: IETF protocol
# assignments (192.0.0.0/24 beyond its /29) and the IPv6 discard prefix.
_NOT_PUBLIC = (ipaddress.ip_network("192.0.0.0/24"), ipaddress.ip_network("100::/64"))


class EgressRefused(Exception):
    """The policy does not let the platform connect there; the text says why."""


# --- the resolver ------------------------------------------------------------------------------------

def system_resolve(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a label IDNA cannot encode ("a..b", 64+ chars)
        raise EgressRefused(f"The agent's host {host!r} does not resolve ({exc}).") from None
    return list(dict.fromkeys(info[4][0] for info in infos))


# The resolver every check and connection uses, looked up at call time: a test (or an operator's
# plug-in) may point it elsewhere; the policy is applied to whatever it answers.
resolve: Resolver = system_resolve


# --- the policy --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One ORS_EVAL_AGENT_ALLOWED_HOSTS entry: a hostname or an IP network, and the ports it admits."""

    text: str
    ports: frozenset[int]
    hostname: str = ""
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None

    def admits(self, host: str, port: int, address: IPAddress) -> bool:
        if port not in self.ports:
            return False
        if self.network is not None:
            return address.version == self.network.version and address in self.network
        return host == self.hostname


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"bad port in {entry!r}")
    return int(text)


def parse_entry(entry: str) -> Entry:
    """`host`, `host:port`, `IP`, `IP:port`, `[v6]`, `[v6]:port`, `CIDR`, `CIDR:port`, `[v6CIDR]:port`.
    Without a port, only 80 and 443 (an entry naming a machine must not open its Redis)."""
    text = entry.strip()
    ports = DEFAULT_PORTS
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad entry {entry!r}")
        if rest:
            ports = frozenset({_port(rest[1:], entry)})
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
        ports = frozenset({_port(port, entry)})
    else:
        host = text  # a name, an IPv4 address or range, or a bare IPv6 address or range (no port)
    try:
        return Entry(text=text, ports=ports, network=ipaddress.ip_network(host, strict=False))
    except ValueError:
        pass
    name = host.lower().rstrip(".")
    if not name or not all(part and len(part) < 64 and all(c.isalnum() or c in "-_" for c in part)
                           for part in name.split(".")):
        raise ValueError(f"bad entry {entry!r}")
    return Entry(text=text, ports=ports, hostname=name)


@lru_cache(maxsize=16)
def parse_allow_list(entries: tuple[str, ...]) -> tuple[Entry, ...]:
    parsed = []
    for entry in entries:
        try:
            parsed.append(parse_entry(entry))
        except ValueError as exc:
            # Fail closed: the list stays non-empty (so the "public only" default does not take
            # over), and the broken entry admits nothing.
            log.warning("ORS_EVAL_AGENT_ALLOWED_HOSTS: ignoring %s", exc)
    return tuple(parsed)


def embedded_form(address: IPAddress) -> str:
    """If `address` is an IPv6 form that leads to an IPv4 address through a translator or tunnel,
    what it is (naming the IPv4 address it embeds where there is one); else ""."""
    if address.version != 6:
        return ""
    assert isinstance(address, ipaddress.IPv6Address)
    if address.ipv4_mapped is not None:
        return f"an IPv4-mapped address (of {address.ipv4_mapped})"
    value = int(address)
    if value >> 32 == 0 and value > 1:
        return f"an IPv4-compatible address (of {ipaddress.IPv4Address(value & 0xFFFFFFFF)})"
    if address in _IPV4_TRANSLATED:
        return f"an IPv4-translated address (of {ipaddress.IPv4Address(value & 0xFFFFFFFF)})"
    if address in _NAT64:
        return f"a NAT64 address (of {ipaddress.IPv4Address(value & 0xFFFFFFFF)})"
    if address in _NAT64_LOCAL:
        return "a local-use NAT64 address"
    if address.sixtofour is not None:
        return f"a 6to4 address (of {address.sixtofour})"
    if address.teredo is not None:
        return f"a Teredo address (of {address.teredo[1]}, via {address.teredo[0]})"
    return ""


def is_public(address: IPAddress) -> bool:
    # is_global alone lets multicast through (and, on this Python, some reserved IPv6 space).
    return address.is_global and not (
        address.is_multicast or address.is_reserved or address.is_unspecified or address.is_loopback
        or address.is_link_local or address.is_private or getattr(address, "is_site_local", False)
        or any(address.version == n.version and address in n for n in _NOT_PUBLIC))


def refusal(host: str, port: int, address: IPAddress, allowed: tuple[str, ...]) -> str:
    """Why the platform may not connect to `address` (port `port`) for `host`; "" if it may."""
    shown = f"[{host}]" if ":" in host else host
    where = f"{shown}:{port}" if host == str(address) else f"{shown}:{port} ({address})"
    form = embedded_form(address)
    if form:
        # Where such an address leads is decided by a translator or tunnel the platform does not see.
        return f"The agent's address {where} is {form}; such addresses are refused."
    if allowed:
        if any(entry.admits(host, port, address) for entry in parse_allow_list(allowed)):
            return ""
        return f"The agent's address {where} is not in ORS_EVAL_AGENT_ALLOWED_HOSTS."
    if not is_public(address):
        return (f"The agent's host {where} has a non-public address; the operator may allow it with "
                "ORS_EVAL_AGENT_ALLOWED_HOSTS.")
    return ""


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def admit(host: str, port: int, allowed: Iterable[str]) -> list[IPAddress]:
    """Resolve `host` once and return its addresses if every one of them may be connected to on
    `port`; else raise EgressRefused. (One refused address refuses the host: a name that resolves
    partly inward is not an agent's.)"""
    allowed = tuple(allowed)
    if not 0 < port < 65536:
        raise EgressRefused(f"The agent's port {port} is not a port to connect to.")
    host = host.lower().rstrip(".")
    literal = _literal(host)
    if literal is not None:
        addresses = [literal]
    else:
        addresses = []
        for text in resolve(host, port):
            parsed = _literal(text.split("%")[0])
            if parsed is None:
                raise EgressRefused(f"The agent's host {host!r} resolved to {text!r}, not an address.")
            addresses.append(parsed)
        if not addresses:
            raise EgressRefused(f"The agent's host {host!r} does not resolve.")
    for address in addresses:
        reason = refusal(host if literal is None else str(literal), port, address, allowed)
        if reason:
            raise EgressRefused(reason)
    return addresses


# --- the call's deadline -----------------------------------------------------------------------------

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("egress_deadline", default=None)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every connect, read and write inside this block ends by `seconds` from now (or an outer
    block's deadline, if sooner), whatever the per-operation timeouts say."""
    end = time.monotonic() + seconds
    outer = _deadline.get()
    token = _deadline.set(end if outer is None else min(outer, end))
    try:
        yield
    finally:
        _deadline.reset(token)


def deadline_passed() -> bool:
    end = _deadline.get()
    return end is not None and time.monotonic() >= end


def _clamp(timeout: float | None, error: type[Exception]) -> float | None:
    end = _deadline.get()
    if end is None:
        return timeout
    remaining = end - time.monotonic()
    if remaining <= 0:
        raise error("the call's deadline passed")
    return remaining if timeout is None else min(timeout, remaining)


class _Stream(NetworkStream):
    def __init__(self, inner: NetworkStream) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, _clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, _clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> NetworkStream:
        return _Stream(self.inner.start_tls(ssl_context, server_hostname, _clamp(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _AsyncStream(AsyncNetworkStream):
    def __init__(self, inner: AsyncNetworkStream) -> None:
        self.inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self.inner.read(max_bytes, _clamp(timeout, httpcore.ReadTimeout))

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self.inner.write(buffer, _clamp(timeout, httpcore.WriteTimeout))

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> AsyncNetworkStream:
        return _AsyncStream(await self.inner.start_tls(ssl_context, server_hostname,
                                                       _clamp(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


# --- network backends that connect only where the policy admits -------------------------------------

def _allowed() -> tuple[str, ...]:
    from django.conf import settings

    return tuple(settings.ORS_EVAL_AGENT_ALLOWED_HOSTS)


class GuardedBackend(NetworkBackend):
    """httpcore's sync backend, connecting only to admitted addresses (resolved once, here)."""

    def __init__(self) -> None:
        self.inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> NetworkStream:
        addresses = admit(host, port, _allowed())
        error: Exception | None = None
        for address in addresses:
            try:
                return _Stream(self.inner.connect_tcp(str(address), port, _clamp(timeout, httpcore.ConnectTimeout),
                                                      local_address, socket_options))
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> NetworkStream:
        raise EgressRefused("Agents are reached over TCP only.")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class AsyncGuardedBackend(AsyncNetworkBackend):
    """httpcore's async backend, connecting only to admitted addresses (resolved once, here)."""

    def __init__(self) -> None:
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> AsyncNetworkStream:
        allowed = _allowed()
        # The resolver blocks (getaddrinfo); a cancelled call abandons its thread rather than wait.
        addresses = await anyio.to_thread.run_sync(admit, host, port, allowed, abandon_on_cancel=True)
        error: Exception | None = None
        for address in addresses:
            try:
                return _AsyncStream(await self.inner.connect_tcp(
                    str(address), port, _clamp(timeout, httpcore.ConnectTimeout), local_address, socket_options))
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> AsyncNetworkStream:
        raise EgressRefused("Agents are reached over TCP only.")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def _pool_options(limits: httpx.Limits, ssl_context: ssl.SSLContext) -> dict[str, Any]:
    return {"ssl_context": ssl_context, "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry}


@lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle costs tens of milliseconds of CPU (with the GIL held); one context,
    # shared (it is thread-safe), spares every /meta fetch that cost.
    return httpx.create_ssl_context(trust_env=False)


def transport(limits: httpx.Limits = httpx.Limits(max_connections=4)) -> httpx.HTTPTransport:
    """An httpx transport whose connections go only where the policy admits. (httpx takes no
    network backend, so the pool it builds is replaced by one that has ours.) Use it with
    `trust_env=False` on the client too: a proxy from the environment would connect elsewhere."""
    context = _ssl_context()
    guarded = httpx.HTTPTransport(verify=context, trust_env=False)
    guarded._pool = httpcore.ConnectionPool(**_pool_options(limits, context), network_backend=GuardedBackend())
    return guarded


def async_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    context = _ssl_context()
    guarded = httpx.AsyncHTTPTransport(verify=context, trust_env=False)
    guarded._pool = httpcore.AsyncConnectionPool(**_pool_options(limits, context),
                                                 network_backend=AsyncGuardedBackend())
    return guarded
