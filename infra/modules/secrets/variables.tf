variable "project" {
  description = "The project the secrets live in."
  type        = string
}

variable "api_tenants" {
  description = "Tenants that get an API key (an admin key is always made)."
  type        = list(string)
  default     = []
}

variable "hook_readers" {
  description = "Members that read the CI hooks' secrets (the ci_hook function)."
  type        = list(string)
  default     = []
}

variable "api_key_readers" {
  description = "Members that read the API keys (the api function)."
  type        = list(string)
  default     = []
}

variable "agent_session_key_readers" {
  description = "Members that read the agents' session key (the agent and reconcile functions)."
  type        = list(string)
  default     = []
}

variable "labels" {
  description = "Labels on every secret."
  type        = map(string)
  default     = {}
}
