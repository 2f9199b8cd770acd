output "enabled" {
  description = "The enabled services (depend on this to order resources after enablement)."
  value       = [for api in google_project_service.api : api.service]
}
