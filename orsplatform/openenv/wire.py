"""OpenEnv 0.10's wire, as its client and server speak it (``openenv/core/env_server/types.py``,
``mcp_types.py``, ``http_server.py``): frames, error codes, request models and JSON schemas.

Request models are pydantic (already there through ``ors-sdk``) so validation errors have exactly the
shape OpenEnv's own server gives them: ``errors`` in a ``VALIDATION_ERROR`` frame, and FastAPI's
``{"detail": [...]}`` with ``loc`` starting at ``"body"`` on HTTP 422.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orsplatform.catalog.selectors import EnvHandle

# WebSocket error codes (openenv.core.env_server.types.WSErrorCode).
INVALID_JSON = "INVALID_JSON"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
VALIDATION_ERROR = "VALIDATION_ERROR"
EXECUTION_ERROR = "EXECUTION_ERROR"
CAPACITY_REACHED = "CAPACITY_REACHED"
SESSION_ERROR = "SESSION_ERROR"

# JSON-RPC 2.0 error codes (openenv.core.env_server.mcp_types.JsonRpcErrorCode).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000

# WebSocket close codes after an error frame: the HTTP status in the application range (daphne's
# autobahn refuses to send 1008 or 1013; a client reads the reason from the frame anyway).
CLOSE_NORMAL = 1000
CLOSE_POLICY = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_TRY_AGAIN = 4429

EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class OpenEnvError(Exception):
    """Refused in OpenEnv's terms: an ``error`` frame (and, with ``close``, the socket closed after it),
    or a JSON-RPC error on ``/mcp``."""

    def __init__(self, code: str, message: str, *, close: int | None = None, status: int = 400,
                 **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.close = close
        self.status = status
        self.extra = extra

    def frame(self) -> dict[str, Any]:
        return error_frame(self.message, self.code, **self.extra)


def dumps(frame: Any) -> str:
    return orjson.dumps(frame).decode()


def error_frame(message: str, code: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def observation_data(observation: dict[str, Any], reward: float | None, done: bool,
                     metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """``serialize_observation``: the observation's own fields (metadata included, as upstream keeps
    it there for typed clients) and reward, done and a non-empty metadata beside them."""
    data: dict[str, Any] = {"observation": observation, "reward": reward, "done": done}
    if metadata:
        data["metadata"] = metadata
    return data


def tool_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """An ORS tool spec as OpenEnv's ``Tool`` (its model rejects a null description or schema)."""
    return {"name": spec["name"], "description": spec.get("description") or "",
            "input_schema": spec.get("input_schema") or spec.get("inputSchema") or EMPTY_SCHEMA}


def validation_errors(exc: ValidationError, prefix: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """pydantic's errors as FastAPI and OpenEnv answer them (JSON-safe, no documentation URLs)."""
    errors = []
    for error in exc.errors(include_url=False):
        item = {"type": error["type"], "loc": [*prefix, *error["loc"]], "msg": error["msg"],
                "input": error.get("input")}
        if error.get("ctx"):
            item["ctx"] = {k: v if isinstance(v, str | int | float | bool | None) else str(v)
                           for k, v in error["ctx"].items()}
        errors.append(item)
    return orjson.loads(orjson.dumps(errors, default=str))


# --- requests --------------------------------------------------------------------------------------


class SecretValue(BaseModel):
    value: str


class ResetData(BaseModel):
    """``reset`` data as the ORS importer template takes it. Other keys are kept for an OpenEnv-SDK
    environment (they are its ``reset`` keyword arguments, see ``reset_kwargs``) and ignored for the
    others, as OpenEnv's server drops keyword arguments the environment's ``reset`` does not take."""

    model_config = ConfigDict(extra="allow")

    task_spec: dict[str, Any] | None = None
    split: str | None = Field(default=None, max_length=100)
    index: int | None = Field(default=None, ge=0)
    seed: int | None = None
    episode_id: str | None = Field(default=None, max_length=255)
    secrets: dict[str, str | SecretValue] | None = None
    # The training run the episode belongs to (docs/runs.md); else the socket's X-Run, else the key's name.
    run: str | None = Field(default=None, max_length=200)
    # An alias of index: TRL forwards each dataset row to reset(**row), and OpenRewardSpec's datasets
    # (and most others) name the column task_index; ignored, every rollout would play task 0.
    task_index: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _task_index_is_index(self) -> ResetData:
        if self.task_index is not None:
            if self.index is not None and self.index != self.task_index:
                raise ValueError(f"index ({self.index}) and task_index ({self.task_index}) name different tasks; "
                                 "give one of them")
            self.index = self.task_index
        return self

    def secret_values(self) -> dict[str, str]:
        return {k: v if isinstance(v, str) else v.value for k, v in (self.secrets or {}).items()}

    def reset_kwargs(self) -> dict[str, Any]:
        """What an OpenEnv-SDK environment's ``reset`` (or a container's server) is called with: every
        key but the task selection, the secrets and the run, which are the platform's (``seed``,
        ``episode_id`` and the environment's own). The run was sent to the server and recorded in the
        episode's task, so a task named by reset arguments differed by the run it was played in."""
        return self.model_dump(mode="json", exclude_unset=True,
                               exclude={"task_spec", "split", "index", "task_index", "secrets", "run"})


class ListToolsAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["list_tools"] = "list_tools"
    metadata: dict[str, Any] = Field(default_factory=dict)


class CallToolAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


Action = ListToolsAction | CallToolAction


def parse_action(data: Any) -> Action:
    """``deserialize_action`` for a call-tool environment: ``list_tools`` by its type, anything else
    as a call (whose type defaults to ``call_tool``). Raises ValidationError."""
    if isinstance(data, dict) and data.get("type") == "list_tools":
        return ListToolsAction.model_validate(data)
    return CallToolAction.model_validate(data)


class ResetRequest(BaseModel):
    """HTTP ``POST /reset`` (extra keys are reset parameters)."""

    model_config = ConfigDict(extra="allow")

    seed: int | None = Field(default=None, ge=0)
    episode_id: str | None = Field(default=None, max_length=255)


class StepRequest(BaseModel):
    """HTTP ``POST /step``."""

    model_config = ConfigDict(extra="allow")

    action: dict[str, Any]
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)


class SplitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    split: str


class TaskRequest(SplitRequest):
    index: int


class TaskRangeRequest(SplitRequest):
    start: int | None = None
    stop: int | None = None


# --- JSON-RPC --------------------------------------------------------------------------------------


def rpc_result(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message, "data": data}}


# --- /schema ---------------------------------------------------------------------------------------

_METADATA = {"type": "object", "additionalProperties": True, "title": "Metadata"}
_OBSERVATION_BASE = {
    "done": {"type": "boolean", "default": False, "title": "Done"},
    "reward": {"anyOf": [{"type": "boolean"}, {"type": "integer"}, {"type": "number"}, {"type": "null"}],
               "default": None, "title": "Reward"},
    "metadata": _METADATA,
}
_BLOCK = {"type": "object", "title": "Block", "description": "An ORS content block (text or image).",
          "properties": {"type": {"enum": ["text", "image"]}, "text": {"type": "string"},
                         "data": {"type": "string"}, "mimeType": {"type": "string"}},
          "required": ["type"]}


def schemas(env: EnvHandle) -> dict[str, Any]:
    """``/schema``: an OpenEnv-SDK environment's own models (as its inspection recorded them); for
    the others, the call-tool action with one variant per shared tool (its arguments are the
    tool's input schema), the call observation, the reset observation and the state. Task-specific
    tools are known only per episode (``list_tools``), so a free-form call stays allowed."""
    if env.openenv:
        return env.openenv["schema"]
    variants = [{
        "type": "object", "title": f"call_tool:{spec['name']}", "description": spec["description"],
        "properties": {"type": {"const": "call_tool", "default": "call_tool"},
                       "tool_name": {"const": spec["name"]}, "arguments": spec["input_schema"],
                       "metadata": _METADATA},
        "required": ["tool_name", "arguments"], "additionalProperties": False,
    } for spec in map(tool_spec, env.tools)]
    variants.append({
        "type": "object", "title": "call_tool (a task's own tool)",
        "properties": {"type": {"const": "call_tool", "default": "call_tool"}, "tool_name": {"type": "string"},
                       "arguments": {"type": "object", "additionalProperties": True}, "metadata": _METADATA},
        "required": ["tool_name"], "additionalProperties": False,
    })
    variants.append({"type": "object", "title": "list_tools",
                     "properties": {"type": {"const": "list_tools"}, "metadata": _METADATA},
                     "required": ["type"], "additionalProperties": False})
    observation = {
        "title": "CallToolObservation", "type": "object",
        "properties": {
            **_OBSERVATION_BASE,
            "tool_name": {"type": "string", "title": "Tool Name"},
            "result": {"anyOf": [{"type": "object", "properties": {
                "blocks": {"type": "array", "items": _BLOCK}, "metadata": _METADATA}}, {"type": "null"}],
                "default": None, "title": "Result"},
            "error": {"anyOf": [{"type": "object", "properties": {
                "error_type": {"enum": ["execution_error", "invalid_args", "transport_error", "tool_not_found",
                                       "timeout"]}, "message": {"type": "string"}},
                "required": ["error_type", "message"]}, {"type": "null"}], "default": None, "title": "Error"},
        },
        "required": ["tool_name"],
    }
    reset_observation = {
        "title": "Observation", "type": "object", "properties": _OBSERVATION_BASE,
        "description": "metadata holds the episode's prompt (ORS blocks), its task_spec, source_type 'ors', "
                       "the environment and the session_id.",
    }
    state = {
        "title": "State", "type": "object", "additionalProperties": True,
        "properties": {
            "episode_id": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "step_count": {"type": "integer", "minimum": 0, "default": 0},
            "session_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "task_spec": {"anyOf": [{"type": "object"}, {"type": "null"}]},
            "split": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "index": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
    }
    return {"action": {"title": "CallToolAction", "anyOf": variants}, "observation": observation,
            "reset_observation": reset_observation, "state": state}
