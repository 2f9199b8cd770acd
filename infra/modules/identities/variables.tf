variable "project" {
  description = "The project the accounts live in."
  type        = string
}

variable "accounts" {
  description = "Service accounts by key: account id, display name, description, and project-level roles (never basic roles)."
  type = map(object({
    account_id    = string
    display_name  = string
    description   = string
    project_roles = list(string)
  }))

  validation {
    condition = alltrue(flatten([
      for account in values(var.accounts) : [
        for role in account.project_roles : !contains(["roles/owner", "roles/editor", "roles/viewer"], role)
      ]
    ]))
    error_message = "Basic roles (owner, editor, viewer) are never granted: name the predefined roles a function needs."
  }
}

variable "firestore_database" {
  description = "The Firestore database the accounts' datastore roles are limited to."
  type        = string
  default     = "(default)"
}
