//! The .proto files are the protocol's documentation: every service, method, field and enum
//! value must carry a comment.

use std::collections::HashSet;

use prost::Message;
use prost_types::FileDescriptorSet;
use specd_wire::descriptor::FILE_DESCRIPTOR_SET;

// Field numbers of descriptor.proto, used in SourceCodeInfo paths.
const FILE_MESSAGE_TYPE: i32 = 4;
const FILE_ENUM_TYPE: i32 = 5;
const FILE_SERVICE: i32 = 6;
const MESSAGE_FIELD: i32 = 2;
const ENUM_VALUE: i32 = 2;
const SERVICE_METHOD: i32 = 2;

#[test]
fn every_service_method_field_and_enum_value_is_documented() {
    let set = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
    let mut undocumented = Vec::new();
    for file in set.file.iter().filter(|f| f.package() == "specd.v1") {
        let documented: HashSet<Vec<i32>> = file
            .source_code_info
            .as_ref()
            .expect("source info is kept")
            .location
            .iter()
            .filter(|l| {
                l.leading_comments
                    .as_deref()
                    .is_some_and(|c| !c.trim().is_empty())
                    || l.trailing_comments
                        .as_deref()
                        .is_some_and(|c| !c.trim().is_empty())
            })
            .map(|l| l.path.clone())
            .collect();
        let mut require = |path: Vec<i32>, what: String| {
            if !documented.contains(&path) {
                undocumented.push(format!("{}: {what}", file.name()));
            }
        };
        for (i, service) in file.service.iter().enumerate() {
            let path = vec![FILE_SERVICE, i as i32];
            require(path.clone(), format!("service {}", service.name()));
            for (j, method) in service.method.iter().enumerate() {
                let mut p = path.clone();
                p.extend([SERVICE_METHOD, j as i32]);
                require(p, format!("rpc {}.{}", service.name(), method.name()));
            }
        }
        for (i, enumeration) in file.enum_type.iter().enumerate() {
            for (j, value) in enumeration.value.iter().enumerate() {
                require(
                    vec![FILE_ENUM_TYPE, i as i32, ENUM_VALUE, j as i32],
                    format!("enum value {}", value.name()),
                );
            }
        }
        for (i, message) in file.message_type.iter().enumerate() {
            for (j, field) in message.field.iter().enumerate() {
                require(
                    vec![FILE_MESSAGE_TYPE, i as i32, MESSAGE_FIELD, j as i32],
                    format!("field {}.{}", message.name(), field.name()),
                );
            }
        }
    }
    assert!(undocumented.is_empty(), "undocumented: {undocumented:#?}");
}
