output "topics" {
  description = "The Pub/Sub topics: events (status events), ticks, admin_requests (the admins' requests), and requests (the shared topic, when made)."
  value       = module.pubsub.topics
}

output "tenant_request_topics" {
  description = "Each tenant's request topic (capacity-requests-{tenant}): its publishers submit, cancel and release its requests there."
  value       = module.pubsub.tenant_request_topics
}

output "tenant_event_subscriptions" {
  description = "Each tenant's event subscription (capacity-events-{tenant}), which delivers that tenant's events only."
  value       = module.pubsub.tenant_event_subscriptions
}

output "dead_letter_subscription" {
  description = "Request messages intake could not take, held for inspection."
  value       = module.pubsub.requests_dead_letter_subscription
}

output "api_url" {
  description = "The HTTP API; its root (GET /) is the dashboard, which asks for a key (none behind IAP)."
  value       = module.api.url
}

output "api_iap" {
  description = "The api through Identity-Aware Proxy (null without api_iap): url, the load balancer's address (the domain's DNS A record), and the audience of IAP's signed header the api checks."
  value = var.api_iap == null ? null : {
    url      = module.api_iap[0].url
    address  = module.api_iap[0].address
    audience = module.api_iap[0].audience
  }
}

output "api_audiences" {
  description = "The audiences a workload's Google ID token for the api may name (either of the api's URLs)."
  value       = local.api_urls
}

output "ci_hook_url" {
  description = "The CI webhook's URL (/github, /gitlab or /hook)."
  value       = module.ci_hook.url
}

output "timer_url" {
  description = "The timer function's run.app URL, which Cloud Tasks calls (internal-only ingress admits Cloud Tasks there) and names as the tokens' audience."
  value       = local.timer_url
}

output "agent_url" {
  description = "The agent function's run.app URL, where the job VMs' agents report and the audience of their identity tokens (OPENDWS_AGENT_URL)."
  value       = local.agent_url
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
