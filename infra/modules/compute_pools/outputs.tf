output "templates" {
  description = "Instance templates by machine type."
  value       = { for shape, template in google_compute_instance_template.flex : shape => template.self_link }
}
