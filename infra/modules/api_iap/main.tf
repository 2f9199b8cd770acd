# Identity-Aware Proxy in front of the api (iap/docs/enabling-cloud-run, "on the backend service
# fronting the Cloud Run services"): a global external Application Load Balancer at the given
# domain whose one backend is the api function's Cloud Run service, through a serverless
# network endpoint group, with IAP on that backend service. IAP signs each call it lets through
# with the x-goog-iap-jwt-assertion header, whose audience is
# /projects/PROJECT_NUMBER/global/backendServices/BACKEND_SERVICE_ID (iap/docs/
# signed-headers-howto): the api verifies it (OPENDWS_API_IAP_AUDIENCE, the `audience` output).
#
# IAP is on the backend service rather than on the Cloud Run service itself (iap_enabled on a
# google_cloud_run_v2_service), because Cloud Functions, not Terraform, owns the function's
# service. Without an OAuth client IAP uses the Google-managed one, which admits accounts of the
# project's organization (iap/docs/enabling-cloud-run).

resource "google_compute_region_network_endpoint_group" "api" {
  project               = var.project
  name                  = "${var.name}-neg"
  region                = var.region
  network_endpoint_type = "SERVERLESS"

  # A gen2 function's Cloud Run service has the function's name (the root checks it).
  cloud_run {
    service = var.service_name
  }
}

resource "google_compute_backend_service" "api" {
  project               = var.project
  name                  = "${var.name}-backend"
  description           = "The opendws api function behind Identity-Aware Proxy."
  load_balancing_scheme = "EXTERNAL_MANAGED"

  # A serverless backend takes no health check and no timeout of the load balancer's.
  backend {
    group = google_compute_region_network_endpoint_group.api.id
  }

  iap {
    enabled = true
  }
}

# Who may pass IAP (the api then maps each one to a tenant by the configuration's access table).
resource "google_iap_web_backend_service_iam_member" "accessor" {
  for_each = toset(var.members)

  project             = var.project
  web_backend_service = google_compute_backend_service.api.name
  role                = "roles/iap.httpsResourceAccessor"
  member              = each.value
}

resource "google_compute_url_map" "api" {
  project         = var.project
  name            = "${var.name}-urls"
  default_service = google_compute_backend_service.api.id
}

resource "google_compute_managed_ssl_certificate" "api" {
  project = var.project
  name    = "${var.name}-cert"

  managed {
    domains = [var.domain]
  }
}

resource "google_compute_target_https_proxy" "api" {
  project          = var.project
  name             = "${var.name}-https"
  url_map          = google_compute_url_map.api.id
  ssl_certificates = [google_compute_managed_ssl_certificate.api.id]
}

resource "google_compute_global_address" "api" {
  project = var.project
  name    = "${var.name}-address"
}

resource "google_compute_global_forwarding_rule" "api" {
  project               = var.project
  name                  = "${var.name}-https"
  target                = google_compute_target_https_proxy.api.id
  ip_address            = google_compute_global_address.api.address
  port_range            = "443"
  load_balancing_scheme = "EXTERNAL_MANAGED"
  labels                = var.labels
}
