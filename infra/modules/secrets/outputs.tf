output "hook_secret_ids" {
  description = "Secret ids by CI provider: github, gitlab, generic."
  value       = { for key, secret in google_secret_manager_secret.hook : key => secret.secret_id }
}

output "api_keys_secret_id" {
  description = "The API keys' secret id."
  value       = google_secret_manager_secret.api_keys.secret_id
}

output "agent_session_key_secret_id" {
  description = "The agents' session key's secret id."
  value       = google_secret_manager_secret.agent_session_key.secret_id
}

output "hook_secrets" {
  description = "The generated hook secrets (to paste into GitHub's or GitLab's webhook settings)."
  value       = { for key, secret in random_password.hook : key => secret.result }
  sensitive   = true
}

output "api_keys" {
  description = "The generated API key of each tenant, and the admin's."
  value       = { for tenant, key in random_password.api_key : tenant => key.result }
  sensitive   = true
}
