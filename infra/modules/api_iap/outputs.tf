output "audience" {
  description = "The audience of IAP's signed header for this backend (OPENDWS_API_IAP_AUDIENCE)."
  value       = "/projects/${var.project_number}/global/backendServices/${google_compute_backend_service.api.generated_id}"
}

output "url" {
  description = "The api through IAP."
  value       = "https://${var.domain}"
}

output "address" {
  description = "The load balancer's IP address (the domain's DNS A record)."
  value       = google_compute_global_address.api.address
}
