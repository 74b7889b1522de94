"""mighty.capabilities: what agents and sandboxes may call beyond themselves, declared as data
(host tools, MCP servers, HTTP grants) and granted by name (see docs/capabilities.md)."""

from mighty.capabilities._agent import AGENT_TOOLS, AgentTools, AgentToolsProvider
from mighty.capabilities._mcp_client import (
    McpClient,
    McpServer,
    McpToolFailed,
    McpToolInfo,
    McpUnavailable,
)
from mighty.capabilities._registry import (
    Capabilities,
    CapabilityBroker,
    HostTool,
    HttpCapability,
    InvalidMcpArguments,
    mcp_tool,
    mcp_tools,
)

__all__ = [
    "AGENT_TOOLS",
    "AgentTools",
    "AgentToolsProvider",
    "Capabilities",
    "CapabilityBroker",
    "HostTool",
    "HttpCapability",
    "InvalidMcpArguments",
    "McpClient",
    "McpServer",
    "McpToolFailed",
    "McpToolInfo",
    "McpUnavailable",
    "mcp_tool",
    "mcp_tools",
]
