output "topics" {
  description = "The Pub/Sub topics: requests (publish request messages here), events (status events), ticks."
  value       = module.pubsub.topics
}

output "dead_letter_subscription" {
  description = "Request messages intake could not take, held for inspection."
  value       = module.pubsub.requests_dead_letter_subscription
}

output "api_url" {
  description = "The HTTP API; its root (GET /?key=KEY) is the dashboard."
  value       = module.api.url
}

output "ci_hook_url" {
  description = "The CI webhook's URL (/github, /gitlab or /hook)."
  value       = module.ci_hook.url
}

output "timer_url" {
  description = "The timer function's run.app URL, which Cloud Tasks calls (internal-only ingress admits Cloud Tasks there) and names as the tokens' audience."
  value       = local.timer_url
}

output "timer_queue" {
  description = "The Cloud Tasks queue of the timers."
  value       = module.tasks.queue
}

output "service_accounts" {
  description = "Each function's service account, and the invokers'."
  value       = module.identities.emails
}

output "hook_secrets" {
  description = "The CI hooks' shared secrets (terraform output -json hook_secrets)."
  value       = module.secrets.hook_secrets
  sensitive   = true
}

output "api_keys" {
  description = "Each API tenant's key and the admin's (terraform output -json api_keys)."
  value       = module.secrets.api_keys
  sensitive   = true
}
