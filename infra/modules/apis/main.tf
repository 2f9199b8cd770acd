# The Google APIs opendws uses. They stay enabled on destroy: other things may use them.

resource "google_project_service" "api" {
  for_each = toset(var.services)

  project            = var.project
  service            = each.value
  disable_on_destroy = false
}
