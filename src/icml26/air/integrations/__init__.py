"""AIR in agent frameworks: LangChain middleware (``air.integrations.langchain``), an MCP proxy
(``air.integrations.mcp``) and an AgentDojo pipeline element (``air.integrations.agentdojo``); each behind its own
extra and imported only when used."""
